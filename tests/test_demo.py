"""The demo's logprob report and the comparison the vLLM GPU test makes with it (vllm_blockfp8/demo.py). CPU only:
vLLM's output objects are stood in for by the attributes the demo reads."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

from vllm_blockfp8 import demo


def _output(prompt, generated, prompt_lps, step_lps):
    """A vLLM RequestOutput as the demo reads it: logprobs per position as {token id: Logprob}."""
    wrap = lambda d: {tok: SimpleNamespace(logprob=lp, rank=1) for tok, lp in d.items()}  # noqa: E731
    return SimpleNamespace(prompt_logprobs=[None] + [wrap(d) for d in prompt_lps],
                           outputs=[SimpleNamespace(token_ids=list(generated), logprobs=[wrap(d) for d in step_lps])])


def _run(seed=0, shift=0.0, generated=(7, 8)):
    """Records of one demo run: each position's 5 best tokens plus the prompt's own, as the demo prints them."""
    rng = random.Random(seed)
    records = []
    for prompt in demo.PROMPTS:
        def top(own):
            d = {tok: -2.0 - rng.random() for tok in rng.sample(range(50), 5)}
            d.setdefault(own, -9.0)
            return {t: lp + shift for t, lp in d.items()}
        prompt_lps = [top(tok) for tok in prompt[1:]]
        step_lps = [top(tok) for tok in generated]
        line = demo.logprobs_line(prompt, _output(prompt, generated, prompt_lps, step_lps))
        records += demo.parse_logprobs("noise\n" + line + "\nprompt [1] -> generated [2]\n")
    return records


def test_logprobs_line_round_trips():
    records = _run()
    assert [r["prompt"] for r in records] == [list(p) for p in demo.PROMPTS]
    for record, prompt in zip(records, demo.PROMPTS):
        assert record["generated"] == [7, 8]
        assert len(record["prompt_logprobs"]) == len(prompt) - 1 and len(record["step_logprobs"]) == 2
        # The prompt's own token is reported at every position.
        assert all(str(tok) in d for tok, d in zip(prompt[1:], record["prompt_logprobs"]))


def test_identical_runs_have_no_gap():
    assert demo.logprob_gaps(_run(), _run()) == (0.0, [])


def test_the_gap_is_the_largest_difference():
    worst, problems = demo.logprob_gaps(_run(shift=0.03), _run())
    assert math.isclose(worst, 0.03, rel_tol=1e-9) and problems == []
    ours = _run()
    ours[1]["prompt_logprobs"][4][str(demo.PROMPTS[1][5])] += 0.4
    worst, problems = demo.logprob_gaps(ours, _run())
    assert math.isclose(worst, 0.4, rel_tol=1e-9) and problems == []


def test_steps_after_a_different_token_are_not_compared():
    # Step s's context is the prompt and the tokens before s: a different last token leaves every step comparable.
    ours, ref = _run(generated=(7, 9)), _run(generated=(7, 8))
    for record in ours:
        record["step_logprobs"][1] = {k: v + 5.0 for k, v in record["step_logprobs"][1].items()}
    assert demo.logprob_gaps(ours, ref) == (5.0, [])
    # A different first token: step 0 is compared (same context), no step after it.
    ours = _run(generated=(6, 8))
    for record in ours:
        record["step_logprobs"][0] = {k: v + 0.2 for k, v in record["step_logprobs"][0].items()}
        record["step_logprobs"][1] = {k: v + 5.0 for k, v in record["step_logprobs"][1].items()}
    worst, problems = demo.logprob_gaps(ours, _run(generated=(7, 8)))
    assert math.isclose(worst, 0.2, rel_tol=1e-9) and problems == []


def test_a_reordered_report_is_a_problem():
    # A wrong kernel's run: other tokens at the top (only the prompt's own token is shared at each position).
    worst, problems = demo.logprob_gaps(_run(seed=1), _run(seed=2))
    assert problems and all("tokens in both runs' reports" in p for p in problems)


def test_mismatched_runs_are_refused():
    ours = _run()
    ours[0]["prompt"] = [1, 2]
    assert demo.logprob_gaps(ours, _run()) == (float("inf"), ["the runs did not score the same prompts"])
    ours = _run()
    ours[0]["prompt_logprobs"].pop()
    assert any("prompt positions scored" in p for p in demo.logprob_gaps(ours, _run())[1])
    ours = _run()
    for record in ours:
        record["step_logprobs"] = []
    assert any("no generated step" in p for p in demo.logprob_gaps(ours, _run())[1])
