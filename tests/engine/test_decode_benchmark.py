"""benchmarks/decode.py's speculation ceiling (OracleDraftEngine): with the plain greedy output
as the drafts every draft is accepted, and the output is still the plain output, because the
engine verifies every draft with the main model."""


import pytest

from engine_util import load_benchmark, prompts, tiny_model
from opencomposer.engine import Engine, GenerationRequest, SamplingParams



@pytest.fixture(scope="module")
def decode_bench():
    return load_benchmark("decode")


@pytest.mark.parametrize("depth", [1, 2])
def test_oracle_drafts_are_all_accepted_and_change_nothing(decode_bench, depth):
    model = tiny_model()  # random weights: its own MTP drafts are almost never accepted
    ps = prompts(6, seed=3, min_len=1)
    reqs = [GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=24)) for p in ps]
    plain = Engine(model, max_slots=8, max_len=40)
    want = [r.output_ids for r in plain.generate_batch(reqs)]
    oracle = decode_bench.OracleDraftEngine(model, dict(zip(map(tuple, ps), want)), max_slots=8, max_len=40,
                                            speculative_depth=depth)
    own = Engine(model, max_slots=8, max_len=40, speculative_depth=depth)
    for engine, floor in ((oracle, 0.9), (own, 0.0)):
        got = engine.generate_batch(reqs)
        assert [g.output_ids for g in got] == want
        st = engine.stats
        # The last step of each request drafts past its end (those drafts cannot be accepted).
        assert st.spec_accepted / st.spec_proposed >= floor
    assert oracle.stats.spec_accepted / oracle.stats.spec_proposed > 3 * own.stats.spec_accepted / own.stats.spec_proposed
    # A wrong reference: nothing is accepted, and the output is still the model's own.
    wrong = decode_bench.OracleDraftEngine(model, {tuple(p): [(t + 1) % 61 for t in w] for p, w in zip(ps, want)},
                                           max_slots=8, max_len=40, speculative_depth=depth)
    assert [g.output_ids for g in wrong.generate_batch(reqs)] == want
    assert wrong.stats.spec_accepted == 0
    for engine in (plain, oracle, own, wrong):
        engine.stop()
