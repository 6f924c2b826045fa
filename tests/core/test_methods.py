"""What a method is under a plan (its class's attributes and class methods), the trees it actually builds
and the rules the loop verifies them with, and the method objects' two verbs."""
import numpy as np
import pytest

from helpers import models_for
from specdec_np import build, eagle, methods, verify
from specdec_np.decode import generate
from specdec_np.plan import Plan

# Every plan shape: best-first, fixed top tokens, drawn with and without replacement (a chain and a tree),
# lookup's chains by match, a chain of 1, and a rule that needs a drawn tree (refused where it is not lossless).
PLANS = [Plan(), Plan(shape="fixed", widths=(2, 1)), Plan(widths=(1, 1, 1), sampled="with"),
         Plan(widths=(3, 2), sampled="with"), Plan(widths=(3, 2), sampled="without"), Plan(lookup_chains=(7, 3, 0)),
         Plan(chain=1), Plan(widths=(2, 2), sampled="without", rule="traversal")]
SEQS = ([5, 9, 2, 7], [3, 1, 4, 8, 3, 1, 4])  # the second ends on a repeat: staged verifies its copy


class ArgmaxRand:
    """Rand's interface with no chance in it: a draw gives the most probable token, so that siblings drawn with
    replacement from one q come out equal and siblings drawn without replacement never do; a coin comes up heads
    when p >= 1/2. It counts the draws made while a method proposes (`proposing`)."""

    def __init__(self):
        self.proposing, self.draws = False, 0

    def coin(self, p) -> bool:
        return p >= 0.5

    def draw(self, probs) -> int:
        self.draws += self.proposing
        return int(np.argmax(probs))


def built_kinds(tree, drew: bool) -> set:
    """The kinds a tree built with ArgmaxRand can be, from how it came out: nothing drawn, the draft's top tokens;
    siblings repeated, drawn with replacement; every node's children distinct, without; a drawn chain, either."""
    if not drew:
        return {"deterministic"}
    siblings = list(zip(tree.parents[1:].tolist(), tree.tokens[1:].tolist()))
    if len(set(siblings)) < len(siblings):
        return {"with_replacement"}
    chain = np.bincount(tree.parents[1:], minlength=len(tree)).max(initial=0) <= 1
    return {"with_replacement", "without_replacement"} if chain else {"without_replacement"}


def test_built_kinds_tells_the_three_ways_of_drawing_apart():
    """The control of the test below: the same q gives three trees, top tokens, drawn with and without replacement,
    and `built_kinds` names each as what it is, and only that."""
    q = np.array([0.1, 0.5, 0.3, 0.1])
    dist_fn = lambda tokens, parents, nodes: np.tile(q, (len(nodes), 1))  # noqa: E731
    for drawn, replacement, kind in ((False, True, "deterministic"), (True, True, "with_replacement"),
                                     (True, False, "without_replacement")):
        rand = ArgmaxRand()
        rand.proposing = True
        tree = build.build_fixed(0, dist_fn, (3, 2), rand=rand if drawn else None, replacement=replacement)
        assert built_kinds(tree, drew=rand.draws > 0) == {kind}, kind


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: ",".join(f"{k}={v}" for k, v in vars(p).items()
                                                                if v != getattr(Plan(), k)) or "Plan()")
@pytest.mark.parametrize("method", methods.METHODS)
def test_the_trees_built_are_of_the_kind_the_plan_says_and_verified_by_a_lossless_rule(method, plan, temperature,
                                                                                       small, monkeypatch):
    """Real trees, decoded by `generate` with small random float64 models and a rand that draws the most probable
    token: each drafted tree is of the kind its method's `tree_kind` (the one home of it) declares, seen in how it
    was built (`built_kinds`: whether its method drew while proposing, whether siblings repeat), and labelled so; a
    drafter's tree is drawn from q as plan.sampled says (with or without replacement), and its chain when sampling;
    the rule the loop ran on every tree (stage 2's copies and root-only trees included) is one
    verify.lossless_rules lists for the kind of that tree. A plan whose rule is not lossless for its method's
    trees is refused by check_rule, naming the rule, before any work."""
    target, draft, trigram = small
    draft = eagle.random_head(target) if method == "eagle" else draft  # eagle drafts with a head of the target
    m = methods.METHODS[method]
    if not m.lossless(plan, temperature):
        with pytest.raises(ValueError, match=repr(plan.rule)):
            m.check_rule(plan, temperature)
        return
    rand, drew, propose = ArgmaxRand(), [], m.propose

    def proposing(self, seq, r):  # each step's proposal, and whether it drew
        r.proposing, before = True, r.draws
        try:
            return propose(self, seq, r)
        finally:
            r.proposing = False
            drew.append(r.draws > before)
    monkeypatch.setattr(m, "propose", proposing)
    declared, kinds = m.tree_kind(plan, temperature), set()
    for seq in SEQS:
        drew.clear()
        res = generate(target, seq, 6, method, plan=plan, temperature=temperature, rand=rand, eos=None,
                       keep_trees=True, **models_for(method, draft, trigram))
        assert len(drew) == len(res.stats.steps)
        for step, drawn in zip(res.stats.steps, drew):
            tree, rule = step.trace.tree, step.trace.rule
            chain = np.bincount(tree.parents[1:], minlength=len(tree)).max(initial=0) <= 1
            assert rule in verify.lossless_rules(tree.kind, temperature, chain), (tree.kind, rule)
            if len(tree) > 1 and not step.trace.copied:
                kinds.add(tree.kind)
                built = built_kinds(tree, drawn)
                assert declared in built, (declared, tree.tokens, tree.parents)
                if m.drafts_with and (plan.sampled or m.proposes_chain and temperature > 0):  # drawn from q
                    assert drawn and (plan.sampled is None or f"{plan.sampled}_replacement" in built), built
    assert m.drafts == bool(kinds)  # every method but plain decoding drafted trees here
    assert kinds <= {declared}


def test_sizes_in_the_plans_field_names():
    M = methods.METHODS
    assert M["tree"].max_nodes(Plan(shape="fixed", widths=(2, 3))) == 2 + 6
    assert M["staged"].max_block(Plan(budget=5, copy_len=12)) == 12
    assert M["lookup"].max_depth(Plan(lookup_chains=(7, 3, 0))) == 7
    assert M["staged"].size_fields(Plan()) == ("budget", "copy_len")
    assert M["lookup"].size_fields(Plan(lookup_chains=(7, 3, 0))) == ("lookup_chains",)
    assert M["ar"].size_fields(Plan()) == () and not M["ar"].drafts and M["ar"].max_block(Plan()) == 0
    with pytest.raises(ValueError, match=r"\(widths=9,9\) exceed"):
        M["tree"].check_size(Plan(widths=(9, 9), sampled="with"), 64)
    with pytest.raises(ValueError, match=r"\(budget=8, copy_len=100\) exceed"):
        M["staged"].check_size(Plan(copy_len=100), 64)
    M["staged"].check_size(Plan(), 64)


def test_a_method_is_built_once_with_its_models_and_answers_two_verbs(embedded):
    target, draft, trigram, _ = embedded
    head = eagle.random_head(target)  # eagle's draft is a head of the target's features
    for name in methods.METHODS:
        m = methods.make(name, Plan(), target, head if name == "eagle" else draft, trigram)
        proposal = m.propose([1, 2, 3, 1, 2, 3, 1, 2], None)
        assert proposal.tree.tokens[0] == 2 and len(proposal.tree) - 1 <= m.max_block(Plan())
        m.commit([])


def test_a_draft_scratch_the_context_cannot_hold_is_refused_before_allocating(small, monkeypatch):
    """B16: budget, depth and guess_len each within the context, their product (the draft's scratch,
    draft_rows) past n_ctx x n_ctx, is refused naming the fields before any cache is allocated; one
    budget less is accepted (the control)."""
    target, draft, trigram = small
    n_ctx = target.config.n_ctx
    big, fits = Plan(budget=22, depth=n_ctx, guess_len=2), Plan(budget=21, depth=n_ctx, guess_len=2)
    staged, tree = methods.METHODS["staged"], methods.METHODS["tree"]
    assert staged.draft_rows(fits) <= n_ctx * n_ctx < staged.draft_rows(big)
    staged.check_size(fits, n_ctx)
    tree.check_size(big, n_ctx)  # no guesses: budget x depth alone fits
    monkeypatch.setattr("specdec_np.gpt2.KVCache", lambda *a, **k: pytest.fail("allocated before the check"))
    with pytest.raises(ValueError, match=rf"plan: budget=22, depth={n_ctx}, guess_len=2 give the draft a scratch") as e:
        generate(target, [1, 2], 4, "staged", draft, trigram, big)
    assert "\n" not in str(e.value)
