"""benchmarks/analysis/fp4_split_fit.py (CPU): the probe table it reads, the partials rule it mirrors from
csrc/fp4/sm90/w4a16_wgmma.cu, and a fit that must recover the constants of synthetic sweep runs exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.analysis import fp4_split_fit as fit

# cluster_slots_probe's table as an H100 printed it.
PROBE = """NVIDIA H100 80GB HBM3: 132 SMs, 228 KB shared memory per SM
CTAs/SM  slots(B x SMs)  CTAs at once in clusters of s = 1..16
      1             132   132  132  117  120  110  102  105  120   81   70   77   84   91   98  105  112
      2             264   264  264  237  248  235  234  224  240  207  210  176  192  182  196  210  224
      3             396   396  396  372  368  345  372  329  360  333  300  308  336  299  294  315  336
"""
SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096), ("narrow", 2112, 7168),
          ("short", 8192, 2048), ("long", 5120, 17408))
TRUE = np.array([2.0, 0.75, 6.3, 0.18, 1.9])  # a, stage, wave, partial_mb, cluster_wave


def test_probe_table_is_read_per_ctas_per_sm():
    slots = fit.parse_slots(PROBE)
    assert sorted(slots) == [1, 2, 3]
    assert slots[1][:4] == [132, 132, 117, 120] and len(slots[2]) == 16
    with pytest.raises(ValueError, match="no cluster_slots_probe table"):
        fit.parse_slots("nothing here")


def test_partials_rule_matches_the_cpp_rule():
    """w4a16_wgmma.cu's rule for the partials (waves x (stages / s + 4) on CTAs per SM x SMs), on counts worked
    out by hand: qkv at M = 256 splits 5 ways (48 tiles, 2 waves of 17 stages beat 1 of 36), gate_up's 192 tiles
    fill every slot, and the 128-token tile's 2 CTAs per SM let o split 8 ways at M = 128."""
    assert fit.partials_rule(256, 6144, 4096, 132) == 5
    assert fit.partials_rule(256, 24576, 4096, 132) == 1
    assert fit.partials_rule(128, 4096, 4096, 132) == 8
    assert fit.tile_of(200) == (256, 1) and fit.tile_of(33) == (64, 2) and fit.tile_of(9) == (32, 3)


def _write_runs(tmp_path, slots):
    """One file per (reduction, forced count), as the sweep names them, timed by the TRUE model."""
    runs = [(False, s) for s in (1, 2, 3, 4, 6, 8)] + [(True, s) for s in (2, 3, 4, 6, 8)]
    for i, (cluster, s) in enumerate(runs, 1):
        records = [{"impl": "ours", "shape": name, "m": 256, "n": n, "k": k,
                    "us": float(np.dot(TRUE, fit.features(256, n, k, s, cluster, slots, 132)))}
                   for name, n, k in SHAPES]
        reduction = "cluster" if cluster else "partials"
        (tmp_path / f"fp4_split_{i}_{reduction}{s}.json").write_text(json.dumps({"records": records}))
    (tmp_path / "fp4_split_99_autoauto.json").write_text(json.dumps({"records": [
        {"impl": "ours", "shape": "qkv", "m": 256, "n": 6144, "k": 4096, "us": 1.0}]}))  # the rule's count: skipped


def test_fit_recovers_the_constants_and_chooses_their_minimum(tmp_path, capsys):
    slots = fit.parse_slots(PROBE)
    _write_runs(tmp_path, slots)
    records = fit.read_runs([tmp_path])
    assert len(records) == 11 * len(SHAPES), "every forced count of both reductions, not the auto file"
    coef, rms = fit.fit(records, slots, 132)
    np.testing.assert_allclose(coef, TRUE, rtol=1e-6, atol=1e-6)
    assert rms < 1e-9
    counts = (1, 2, 3, 4, 6, 8)
    for name, n, k in SHAPES:
        pick = fit.choose(coef, 256, n, k, counts, slots, 132)
        costs = {(s, c): fit.modelled(TRUE, 256, n, k, s, c, slots, 132)
                 for s in counts for c in ((False, True) if s > 1 else (False,))}
        assert costs[pick] == pytest.approx(min(costs.values())), name
    slots_file = tmp_path / "slots.txt"
    slots_file.write_text(PROBE)
    assert fit.main([str(tmp_path), "--slots", str(slots_file), "--m", "256"]) == 0
    out = capsys.readouterr().out
    assert "tile 256: 66 records, rms 0.000" in out and "best sampled 1.000" in out


def test_forced_row_fits_its_own_tile_and_other_tiles_are_left_out(tmp_path, capsys):
    """bench_nvfp4 --rows times a forced row beside the selected one ("ours@ROW"). --row fits those records with the
    forced row's tile (the 128x128 row at M = 256: 2 CTAs per SM, twice the tiles), and the default fit leaves out
    records where the table ran another tile than the M's own (the 128x128 row that M = 129..511 may take)."""
    slots = fit.parse_slots(PROBE)
    runs = [(False, s) for s in (1, 2, 3, 4, 6, 8)] + [(True, s) for s in (2, 3, 4, 6, 8)]
    for i, (cluster, s) in enumerate(runs, 1):
        records = []
        for name, n, k in SHAPES:
            records.append({"impl": "ours@fp4_wgmma_128x128", "row": "fp4_wgmma_128x128", "shape": name, "m": 256,
                            "n": n, "k": k,
                            "us": float(np.dot(TRUE, fit.features(256, n, k, s, cluster, slots, 132, tok=128)))})
            records.append({"impl": "ours", "row": "fp4_wgmma_128x128" if name == "qkv" else "fp4_wgmma_128x256",
                            "shape": name, "m": 256, "n": n, "k": k,
                            "us": float(np.dot(TRUE, fit.features(256, n, k, s, cluster, slots, 132)))})
        reduction = "cluster" if cluster else "partials"
        (tmp_path / f"fp4_split_{i}_{reduction}{s}.json").write_text(json.dumps({"records": records}))
    assert fit.features(256, 6144, 4096, 1, False, slots, 132, tok=128)[2] == 1  # 96 tiles in 264 slots: one wave
    forced = fit.read_runs([tmp_path], "fp4_wgmma_128x128")
    assert len(forced) == 11 * len(SHAPES)
    coef, rms = fit.fit(forced, slots, 132, tok=128)
    np.testing.assert_allclose(coef, TRUE, rtol=1e-6, atol=1e-6)
    selected = fit.read_runs([tmp_path])
    assert len(selected) == 11 * (len(SHAPES) - 1) and all(r[0] != "qkv" for r in selected)
    slots_file = tmp_path / "slots.txt"
    slots_file.write_text(PROBE)
    assert fit.main([str(tmp_path), "--slots", str(slots_file), "--row", "fp4_wgmma_128x128"]) == 0
    assert "tile 128: 66 records, rms 0.000" in capsys.readouterr().out
    assert fit.main([str(tmp_path), "--slots", str(slots_file), "--row", "fp4_dequant_cublas"]) == 2
