"""Calibration prompts for the acceptance profile (`python weights/make_calibration.py`): a function's
signature and docstring from each of the first 12 stdlib files held out of the embedded models' training
(`train_tiny.is_heldout`), so the prompts are code the models never saw."""
import ast
import json
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_tiny import stdlib_files, is_heldout
root, rel = stdlib_files()
out = []
for r in sorted(rel):
    if not is_heldout(r) or len(out) >= 12:
        continue
    src = (root / r).read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(src)
    except SyntaxError:
        continue
    lines = src.splitlines(keepends=True)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and len(node.body) > 2:
            doc = node.body[0]
            start = node.lineno - 1 - len(node.decorator_list)
            prompt = "".join(lines[start:doc.end_lineno])
            if 150 < len(prompt) < 1200 and not prompt.startswith(" "):
                out.append({"file": r, "prompt": prompt})
                break
print(f"{len(out)} prompts -> specdec_np/weights/calibration.jsonl")
with open(Path(__file__).resolve().parents[1] / "specdec_np" / "weights" / "calibration.jsonl", "w") as f:
    for rec in out:
        f.write(json.dumps(rec) + "\n")
