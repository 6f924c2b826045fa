"""What a method is under a plan, without models (methods.py's pure functions), and the method
objects' two verbs."""

import pytest

from specdec_np import methods, verify
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
    assert methods.oversized("tree", Plan(widths=(9, 9), sampled="with"), 64) == "widths"
    assert methods.oversized("staged", Plan(copy_len=100), 64) == "copy_len"
    assert methods.oversized("staged", Plan(), 64) is None
    # speculative decoding draws its chain from q when sampling (classic speculative sampling)
    assert methods.drawn("speculative", Plan(), 1.0) == "with" and methods.drawn("speculative", Plan(), 0.0) is None
    assert methods.describe("lookup", Plan(chain=7)) == "a chain of 7 copied from the context"


def test_a_method_is_built_once_with_its_models_and_answers_two_verbs(embedded):
    target, draft, trigram, _ = embedded
    for name in methods.METHODS:
        m = methods.make(name, Plan(), target, draft, trigram)
        proposal = m.propose([1, 2, 3, 1, 2, 3, 1, 2], None)
        assert proposal.tree.tokens[0] == 2 and len(proposal.tree) - 1 <= methods.max_block(name, Plan())
        m.commit([])
