"""What a method is under a plan, without models (its class's attributes and class methods), and the
method objects' two verbs."""

import pytest

from specdec_np import eagle, methods, verify
from specdec_np.decode import generate
from specdec_np.plan import Plan

PLANS = [Plan(), Plan(shape="fixed", widths=(2, 1)), Plan(widths=(1, 1, 1), sampled="with"),
         Plan(widths=(2, 2), sampled="without"), Plan(lookup_chains=(7, 3, 0)), Plan(chain=1)]


@pytest.mark.parametrize("plan", PLANS, ids=str)
@pytest.mark.parametrize("method", methods.METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_check_rule_refuses_exactly_the_rules_not_lossless_for_the_method(method, plan, temperature):
    """check_rule accepts a rule iff `lossless` says so, iff verify.lossless_rules lists it for the
    method's tree kind (verify.LOSSLESS): the CLI words its messages from the same functions."""
    m = methods.METHODS[method]
    kind = m.tree_kind(plan, temperature)
    allowed = verify.lossless_rules(kind, temperature, m.chains(plan))
    assert set(allowed) <= set(verify.LOSSLESS[kind][1])
    assert m.drafts == (m.max_nodes(plan) > 0)  # only plain decoding drafts nothing, under any plan
    for rule in verify.RULES:
        ruled = Plan(**{**plan.__dict__, "rule": rule})
        assert m.lossless(ruled, temperature) == (not m.drafts or rule in allowed)
        if m.lossless(ruled, temperature):
            m.check_rule(ruled, temperature)
        else:
            with pytest.raises(ValueError):
                m.check_rule(ruled, temperature)


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
    # speculative decoding draws its chain from q when sampling (classic speculative sampling)
    assert M["speculative"].tree_kind(Plan(), 1.0) == "with_replacement"
    assert M["speculative"].tree_kind(Plan(), 0.0) == "deterministic"


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
