"""Each figure of the report against the simulated one, with a stated tolerance.

Tolerances, and why:

- arithmetic figures: the report rounds (6.3 GB, "1.5M", "about 10"), so the tolerance is the
  rounding or the word "about";
- simulated figures: the simulator is deterministic for a seed, but a different seed moves a
  figure by its seed-to-seed spread, measured over seeds 0–3 when the parameters were set:
  ±6% for the baseline step (its rollout ends with the slowest of 8 tasks), ±3% for
  throughput, ±0.04 for the tail share. The tolerances are about twice that spread (10% and
  ±0.06): tight enough that a broken mechanism fails, loose enough that a harmless change of
  event order does not.

``reproduce_report`` runs six scenarios once for the module (≈ 20 s of CPU on one core).
"""

from __future__ import annotations

import pytest

from agentrl.sim.calibration import CalibrationFigure, reproduce_report

pytestmark = pytest.mark.slow  # the module fixture runs six simulations


@pytest.fixture(scope="module")
def figures() -> dict[str, CalibrationFigure]:
    return {f.figure: f for f in reproduce_report()}


def value(figures: dict[str, CalibrationFigure], name: str) -> float:
    simulated = figures[name].simulated
    assert isinstance(simulated, float | int)
    return float(simulated)


def test_64k_trajectory_kv_is_6_3_gb(figures: dict[str, CalibrationFigure]) -> None:
    # "6.3 GB" is rounded to 0.1 GB: anything in [6.25, 6.35) reads as 6.3.
    assert 6.25 <= value(figures, "kv_gb_per_64k_trajectory") < 6.35


def test_report_engine_pool_is_about_1_5_million_tokens(
        figures: dict[str, CalibrationFigure]) -> None:
    # "1.5M" with an assumed memFractionStatic of 0.7: within 10% (1.35M–1.65M).
    assert 1_350_000 <= value(figures, "kv_pool_tokens_per_engine") <= 1_650_000


def test_about_ten_runaway_generations_fill_the_cache(
        figures: dict[str, CalibrationFigure]) -> None:
    # "about 10": 8 to 12, both by arithmetic and in the simulated engine without a cap.
    assert 8 <= value(figures, "runaways_to_fill_cache") <= 12
    assert 8 <= value(figures, "runaways_resident_at_stall") <= 12


def test_a_64k_engine_context_cap_removes_the_queueing_until_timeout(
        figures: dict[str, CalibrationFigure]) -> None:
    assert value(figures, "llm_timeouts_with_64k_cap") == 0
    assert "without the cap: 0 timeouts" not in figures["llm_timeouts_with_64k_cap"].note


def test_step_time_drops_from_850_to_284_seconds(figures: dict[str, CalibrationFigure]) -> None:
    assert 850 * 0.9 <= value(figures, "step_seconds_baseline") <= 850 * 1.1
    assert 284 * 0.9 <= value(figures, "step_seconds_async_capped") <= 284 * 1.1
    # 850 / 284 = 2.99; ±15% as the quotient of two ±10% figures, roughly.
    assert 2.99 * 0.85 <= value(figures, "step_speedup") <= 2.99 * 1.15


def test_baseline_step_breaks_down_like_the_report(figures: dict[str, CalibrationFigure]) -> None:
    # 63% actor update, 29% waiting for rollout, 8% log-prob recomputation; ±0.06 each.
    assert value(figures, "step_share_actor_update") == pytest.approx(0.63, abs=0.06)
    assert value(figures, "step_share_wait_for_rollout") == pytest.approx(0.29, abs=0.06)
    assert value(figures, "step_share_logprob") == pytest.approx(0.08, abs=0.06)


def test_rollout_goes_from_860_to_3480_trajectories_per_hour(
        figures: dict[str, CalibrationFigure]) -> None:
    assert 860 * 0.9 <= value(figures, "trajectories_per_hour_baseline") <= 860 * 1.1
    assert 3480 * 0.9 <= value(figures, "trajectories_per_hour_report") <= 3480 * 1.1
    # 3480 / 860 = 4.05, ±15%.
    assert 4.05 * 0.85 <= value(figures, "throughput_ratio") <= 4.05 * 1.15


def test_a_third_of_synchronous_rollout_time_comes_after_90_percent_finished(
        figures: dict[str, CalibrationFigure]) -> None:
    assert value(figures, "tail_share_after_90pct") == pytest.approx(0.32, abs=0.06)


def test_sandbox_concurrency_limits_384_and_one_proxy_limits_the_baseline(
        figures: dict[str, CalibrationFigure]) -> None:
    assert figures["bottleneck_at_384"].simulated == "sandbox concurrency"
    assert figures["bottleneck_baseline"].simulated == "rollout workers"


def test_llm_calls_take_about_three_quarters_of_a_cloud_trajectory(
        figures: dict[str, CalibrationFigure]) -> None:
    # The report: 77% LLM, 22% tests, tools, install and startup; ±0.06.
    assert value(figures, "llm_share_of_cloud_trajectory") == pytest.approx(0.77, abs=0.06)


def test_every_figure_says_how_it_was_obtained(figures: dict[str, CalibrationFigure]) -> None:
    assert {f.kind for f in figures.values()} <= {
        "arithmetic", "fitted", "predicted", "informational"}
    informational = [f for f in figures.values() if f.kind == "informational"]
    assert all(f.note for f in informational)
