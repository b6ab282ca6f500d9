"""The cuSPARSELt algorithm sweep that f1_choice and act24_choice share (planning/measure.py), on CPU:
fake products and times stand in for cuSPARSELt and the CUDA events."""

import torch

from sparse_compile.planning import measure

WANT = torch.ones(4, 8)


def _sweep(monkeypatch, results: dict, times: dict, one_call: dict | None = None, dense_ms: float = 1.0):
    def product(alg):
        if alg not in results:
            raise RuntimeError("cuSPARSELt refuses this algorithm id")
        return results[alg]

    monkeypatch.setattr(measure, "back_to_back_ms", lambda call: times[call.__defaults__[0]])
    monkeypatch.setattr(measure, "one_call_ms", lambda call: (one_call or {}).get(call.__defaults__[0], 0.0))
    return measure.fastest_cslt_alg(product, lambda a: None, WANT, dense_ms)


def test_sweep_picks_the_fastest_right_algorithm_and_stops_at_the_first_refused(monkeypatch):
    results = {0: WANT, 1: WANT * 2, 2: WANT, 3: WANT, 5: WANT}  # 1 wrong; 4 refused: 5 never tried
    assert _sweep(monkeypatch, results, {0: 3.0, 2: 1.0, 3: 2.0, 5: 0.1}) == (2, "")


def test_sweep_says_why_none_is_usable(monkeypatch):
    results = {0: WANT * 2, 1: WANT[:2], 2: WANT}  # a wrong value, a wrong shape, one too slow
    alg, why = _sweep(monkeypatch, results, {}, one_call={2: 11.0})
    assert alg is None
    assert why == "no cuSPARSELt algorithm both right and fast enough to time (2 wrong, 1 over 4x cuBLAS)"
