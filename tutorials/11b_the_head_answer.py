# %% [markdown]
# # Lesson 11b: an answer to exercise 5
#
# Open this once `make exercises` says your head's step is correct (or once you are stuck for good):
# it is one answer to exercise 5, the EAGLE head's step. You will see it printed, run over lesson 11's
# text against the library's head, and then changed on purpose (no position embedding) to see what
# the check and the head's guesses make of it.

# %%
import dataclasses  # noqa: F401  (Try this)
import importlib.util
import inspect
from pathlib import Path

import numpy as np

from specdec_np import eagle, models
from specdec_np.decode import generate
from specdec_np.gpt2 import attention_bias, hidden, lm_head, new_cache, transformer_block
from specdec_np.tokenizer import encode
try:
    import lesson  # tutorials/lesson.py: its folder holds exercises/
    from lesson import check, print_rounding, try_this
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py "
                     "tutorials/11b_the_head_answer.py")

target, _, _, enc = models.load_embedded()
head = models.load_head("tiny-eagle", target)
prompt = encode(enc, "def transpose(matrix):\n    rows = len(matrix)\n    cols = len(matrix[0])\n")  # lesson 11's

# %% [markdown]
# ## The answer
#
# The step has one home, `tutorials/exercises/solutions/eagle_head.py`: this lesson loads it and
# prints it. `fused_pass` is the head's pass (the fusion over [embedding, feature] into its own
# width, its one block over its own cache, then out back to the target's width: its guesses), `head_q`
# the target's tied head on the guesses. `head_step` feeds the
# pairs the cache lacks, token t_j with f_(j-1) at position j, the root's last; then each node of the
# chain on its parent's guess. `head_keep` cuts the cache back to the pairs made of the target's
# features: the accepted nodes were fed on guesses, so the next step feeds them again.

# %%
ANSWER = Path(lesson.__file__).resolve().parent / "exercises" / "solutions" / "eagle_head.py"
_spec = importlib.util.spec_from_file_location("the_head_answer", ANSWER)
answer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(answer)
print(inspect.getsource(answer).split('"""', 2)[2].strip())  # the code, without the file's docstring

# %% [markdown]
# ## Against the library's head
#
# Lesson 11's text (the prompt and the target's greedy tokens after it), fed as one chain of pairs:
# the answer's guesses against `eagle.head_pass`'s, and how often each guess's argmax is the
# target's own next token. The models are float32 here, so the two differ by rounding only.

# %%
text = prompt + generate(target, prompt, 96, eos=None).tokens
n = len(text)
feats = hidden(target, text, new_cache(target))  # [n, d]: f_0..f_(n-1), after ln_f
logits = lm_head(target, feats)  # [n, V]
causal = np.tril(np.ones((n - 1, n - 1), dtype=bool))
guess = eagle.head_features(head, eagle.head_pass(head, feats[:-1], np.array(text[1:]), np.arange(1, n),
                                                   new_cache(head), causal))  # [n - 1, d]: its guesses

by_hand_head = head  # the head the answer runs with
mine = answer.fused_pass(by_hand_head, feats[:-1], np.array(text[1:]), np.arange(1, n), new_cache(head), causal)
print_rounding(f"the answer's fused_pass against eagle.head_pass: largest difference {np.abs(mine - guess).max():.1e}")
same = np.allclose(mine, guess, atol=1e-3)
try_this("the answer runs a head without position embeddings", by_hand_head is not head)
check(same, "the answer's fused_pass != eagle.head_pass")
agree = [int(np.sum(np.argmax(answer.head_q(head, g), -1) == np.argmax(logits[1:], -1))) for g in (mine, guess)]
print_rounding(f"first guess == the target's argmax: the answer at {agree[0]} of {n - 1} positions, "
               f"eagle.head_pass at {agree[1]}")

# %% [markdown]
# One drafting step after the prompt, a chain of 3: the answer's q after the root and after each
# node against the library's drafter (`eagle.FeatureDrafter`), which the loop runs.

# %%
lib = eagle.FeatureDrafter(head, rows=64)
lib.commit([], hidden(target, prompt[:-1], new_cache(target)), 0)  # the target scored the prompt but its last
lib.begin(prompt, 3)
tokens, parents, ref = [prompt[-1]], [-1], []
for i in range(4):  # the library's greedy chain: one head pass a node
    ref.append(lib.dist_fn(tokens, parents, [i])[0])
    tokens, parents = tokens + [int(np.argmax(ref[-1]))], parents + [i]
chain = tokens[1:4]


def top_states(model, tokens):  # [n] -> [n, d]: the top block's output, before the final layer norm
    n, c, p = len(tokens), model.config, model.params
    x = p["wte"][tokens] + p["wpe"][np.arange(n)]
    cache, bias = new_cache(model), attention_bias(np.tri(n, dtype=bool), model.dtype)
    for layer, block in enumerate(p["blocks"]):
        x = transformer_block(x, block, c.n_head, cache, layer, bias, c.layer_norm_epsilon)
    return x


q = answer.head_step(head, target, top_states(target, prompt[:-1]), list(prompt), new_cache(head), chain)
print_rounding(f"one step, the chain {chain}: the answer's q against the library's drafter's, largest difference "
               f"{np.abs(q - np.stack(ref)).max():.1e}")
check(np.allclose(q, np.stack(ref), atol=1e-4), "the answer's head_step != eagle.FeatureDrafter")

# %% [markdown]
# ## Try this
#
# * Run the answer with a head that has no position embedding: set `by_hand_head =
#   dataclasses.replace(head, wpe=0 * head.wpe)` above. The check against `eagle.head_pass` fails
#   (the library's head adds them), and the lesson says so and goes on. The line under it counts
#   the first guesses that still match the target's argmax: it barely moves, if at all, because the
#   features the head reads already carry the positions (the target added its wpe to its input).
