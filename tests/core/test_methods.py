"""What a method is under a plan, without models (methods.py's pure functions), and the method
objects' two verbs."""

import pytest

from specdec_np import methods, verify
from specdec_np.decode import generate
from specdec_np.plan import Plan

PLANS = [Plan(), Plan(shape="fixed", widths=(2, 1)), Plan(widths=(1, 1, 1), sampled="with"),
         Plan(widths=(2, 2), sampled="without"), Plan(lookup_chains=(7, 3, 0)), Plan(chain=1)]


@pytest.mark.parametrize("plan", PLANS, ids=str)
@pytest.mark.parametrize("method", methods.METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_check_rule_refuses_exactly_the_rules_not_lossless_for_the_method(method, plan, temperature):
    """check_rule accepts a rule iff lossless_rules lists it, and every listed rule is lossless
    for the method's tree kind (verify.LOSSLESS): the CLI words its messages from the same functions."""
    allowed = methods.lossless_rules(method, plan, temperature)
    assert set(allowed) <= set(verify.LOSSLESS[methods.kind(method, plan, temperature)][1])
    for rule in verify.RULES:
        ruled = Plan(**{**plan.__dict__, "rule": rule})
        if not methods.drafts(method, ruled) or rule in allowed:
            methods.check_rule(method, ruled, temperature)
        else:
            with pytest.raises(ValueError):
                methods.check_rule(method, ruled, temperature)


def test_sizes_and_words_in_the_plans_field_names():
    assert methods.max_nodes("tree", Plan(shape="fixed", widths=(2, 3))) == 2 + 6
    assert methods.max_block("staged", Plan(budget=5, copy_len=12)) == 12
    assert methods.max_depth("lookup", Plan(lookup_chains=(7, 3, 0))) == 7
    assert methods.size_words("staged", Plan()) == "budget=8, copy_len=12"
    assert methods.size_words("lookup", Plan(lookup_chains=(7, 3, 0))) == "lookup_chains=7,3,0"
    assert methods.size_words("ar", Plan()) == "" and not methods.drafts("ar", Plan())
    with pytest.raises(ValueError, match=r"\(widths=9,9\) exceed"):
        methods.check_size("tree", Plan(widths=(9, 9), sampled="with"), 64)
    with pytest.raises(ValueError, match=r"\(budget=8, copy_len=100\) exceed"):
        methods.check_size("staged", Plan(copy_len=100), 64)
    methods.check_size("staged", Plan(), 64)
    # speculative decoding draws its chain from q when sampling (classic speculative sampling)
    assert methods.kind("speculative", Plan(), 1.0) == "with_replacement"
    assert methods.kind("speculative", Plan(), 0.0) == "deterministic"
    assert methods.describe("lookup", Plan(chain=7)) == "a chain of 7 copied from the context"


def test_a_method_is_built_once_with_its_models_and_answers_two_verbs(embedded):
    target, draft, trigram, _ = embedded
    for name in methods.METHODS:
        m = methods.make(name, Plan(), target, draft, trigram)
        proposal = m.propose([1, 2, 3, 1, 2, 3, 1, 2], None)
        assert proposal.tree.tokens[0] == 2 and len(proposal.tree) - 1 <= methods.max_block(name, Plan())
        m.commit([])


def test_a_draft_scratch_the_context_cannot_hold_is_refused_before_allocating(small, monkeypatch):
    """B16: budget, depth and guess_len each within the context, their product (the draft's scratch,
    draft_rows) past n_ctx x n_ctx, is refused naming the fields before any cache is allocated; one
    budget less is accepted (the control)."""
    target, draft, trigram = small
    n_ctx = target.config.n_ctx
    big, fits = Plan(budget=22, depth=n_ctx, guess_len=2), Plan(budget=21, depth=n_ctx, guess_len=2)
    assert methods.draft_rows("staged", fits) <= n_ctx * n_ctx < methods.draft_rows("staged", big)
    methods.check_size("staged", fits, n_ctx)
    methods.check_size("tree", big, n_ctx)  # no guesses: budget x depth alone fits
    monkeypatch.setattr("specdec_np.gpt2.KVCache", lambda *a, **k: pytest.fail("allocated before the check"))
    with pytest.raises(ValueError, match=rf"plan: budget=22, depth={n_ctx}, guess_len=2 give the draft a scratch") as e:
        generate(target, [1, 2], 4, "staged", draft, trigram, big)
    assert "\n" not in str(e.value)
