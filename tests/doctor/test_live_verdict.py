"""The live probe's verdict from a window of counters and our prediction, and the watch alarm, on synthetic
counters (no model, no server): which verdict, what the per-position pattern points at, when the alarm rings."""

from __future__ import annotations

import pytest

from eaglewire.doctor.counters import Counters
from eaglewire.doctor.live import Answer, EngineWindow, Reference, compare
from eaglewire.doctor.live_positions import conditional
from eaglewire.doctor.watch import break_even_tau, judge_window, watch
from eaglewire.errors import EaglewireError

PRED = Reference(tau=1.9, per_position=[0.6, 0.3, 0.1], answers=["a", "b"], prompt_tokens=[10, 12])


def _window(drafts: float, per_pos: tuple[float, ...], answers=("a", "b")) -> EngineWindow:
    c = Counters("vllm", drafts=drafts, draft_tokens=3 * drafts, accepted=sum(per_pos), accepted_per_pos=per_pos)
    return EngineWindow(c, [Answer(t, n, 5, 0.1) for t, n in zip(answers, (10, 12))], 1.0)


def test_matching_counters_are_healthy_and_lossless():
    rep = compare(_window(400, (240, 120, 40)), PRED, 3, "d", None)
    assert rep.verdict == "healthy" and rep.low_positions == [] and rep.points_at == ""
    assert rep.lossless["identical"] == 2 and rep.lossless["same_template"]
    assert rep.measured["tau"] == pytest.approx(2.0)


def test_a_lost_first_position_points_at_the_wiring():
    rep = compare(_window(400, (20, 2, 0)), PRED, 3, "d", "t")
    assert rep.verdict == "below_expectation" and rep.low_positions[0]["position"] == 0
    assert "taps" in rep.points_at and "doctor check d --target t" in rep.next_command
    assert "doctor probe" in rep.next_command and rep.message.startswith("below expectation by")


def test_later_positions_lost_point_at_norms_and_ttt_depth():
    """The first position as predicted, the second and third conditional rates far below: the recurrence."""
    rep = compare(_window(2000, (1200, 60, 2)), PRED, 3, "d", None)
    assert rep.verdict == "below_expectation"
    assert [p["position"] for p in rep.low_positions] == [1, 2]
    assert "norm" in rep.points_at and "TTT depth" in rep.points_at
    assert rep.next_command == "eaglewire doctor check d --num-speculative-tokens 3"


def test_few_rounds_are_not_flagged_as_noise():
    """A first position a little low over few rounds is inside its Wilson interval: healthy."""
    assert compare(_window(30, (15, 7, 2)), PRED, 3, "d", None).verdict == "healthy"


def test_no_counters_and_counters_that_do_not_move():
    none = EngineWindow(Counters("vllm"), [Answer("a", 10, 5, 0.1)], 1.0)
    assert compare(none, PRED, 3, "d", None).verdict == "no_counters"
    idle = _window(0, (0, 0, 0))
    rep = compare(idle, PRED, 3, "d", None)
    assert rep.verdict == "no_counters" and "not speculating" in rep.message


def test_lossless_check_names_the_first_difference_and_a_template_mismatch():
    w = _window(400, (240, 120, 40), answers=("a", "bX"))
    w.answers[1].prompt_tokens = 13
    ll = compare(w, PRED, 3, "d", None).lossless
    assert ll["identical"] == 1 and ll["first_difference_chars"] == [1] and not ll["same_template"]


def test_conditional_acceptance():
    assert conditional([0.5, 0.25, 0.0]) == [0.5, 0.5, 0.0]
    assert conditional([0.0, 0.0]) == [0.0, 0.0]


def test_sglang_gauge_is_judged_on_tau_alone():
    w = EngineWindow(Counters("sglang", gauge_tau=1.05), [Answer("a", 10, 5, 0.1)], 1.0)
    rep = compare(w, PRED, 3, "d", None)
    assert rep.verdict == "below_expectation" and "no single position" in rep.points_at and "gauge" in rep.message


def test_break_even_tau_is_round_time_over_plain_token_time():
    assert break_even_tau(0.03, 0.02) == pytest.approx(1.5)
    with pytest.raises(EaglewireError):
        break_even_tau(0.0, 0.02)


def _counter_stream(windows):
    """read() of a server whose window i has `windows[i]` = (rounds, accepted) added since the last read."""
    total = [0.0, 0.0]
    snaps = [Counters("vllm", drafts=0.0, accepted=0.0)]
    for d, a in windows:
        total = [total[0] + d, total[1] + a]
        snaps.append(Counters("vllm", drafts=total[0], accepted=total[1]))
    it = iter(snaps)
    return lambda: next(it)


def test_watch_judges_deltas_carries_quiet_windows_and_stops_in_one_shot():
    # healthy for a while, a quiet window, then tau collapses (a server that stopped paying)
    read = _counter_stream([(100, 80), (5, 4), (100, 70), (100, 5), (100, 90)])
    rep = watch(read, alarm_tau=1.3, interval_s=0, iterations=5, min_drafts=20, sleep=lambda s: None)
    assert [r.state for r in rep.readings] == ["ok", "quiet", "ok", "alarm", "ok"]
    assert rep.readings[2].drafts == 105 and rep.readings[2].tau == pytest.approx(1 + 74 / 105)  # quiet carried
    assert rep.readings[3].tau == pytest.approx(1.05) and rep.alarmed
    read = _counter_stream([(100, 80), (100, 5), (100, 90)])
    once = watch(read, alarm_tau=1.3, interval_s=0, iterations=3, one_shot=True, sleep=lambda s: None)
    assert [r.state for r in once.readings] == ["ok", "alarm"]


def test_watch_without_counters_alarms_and_is_bounded():
    reads = iter([Counters("vllm")] * 3)
    rep = watch(lambda: next(reads), 1.2, 0, 2, sleep=lambda s: None)
    assert [r.state for r in rep.readings] == ["no_counters"] * 2 and rep.alarmed
    with pytest.raises(EaglewireError):
        watch(lambda: Counters("vllm"), 1.2, 0, 0)
    assert judge_window(Counters("vllm", drafts=50.0, accepted=10.0), 1.5)[0] == "alarm"


def test_text_report_puts_engine_and_prediction_side_by_side(capsys):
    from eaglewire.cli.doctor_live import _print_live

    _print_live(compare(_window(400, (20, 2, 0)), PRED, 3, "d", "t"), as_json=False)
    out = capsys.readouterr().out
    assert "BELOW EXPECTATION" in out and "points at:" in out and "next: eaglewire doctor check d --target t" in out
    row = next(line for line in out.splitlines() if line.startswith("accepted at position 1"))
    assert row.split()[-2:] == ["0.050", "0.600"]  # engine window, our engine
    assert "rounds in the window: 400;" in out


def test_plain_url_timing_gives_the_round_cost(monkeypatch):
    """--plain-url: decode seconds per round on the speculative server over seconds per token on the plain one."""
    import eaglewire.doctor.live as live
    from eaglewire.cli.doctor_live import _plain_timing

    monkeypatch.setattr(live, "served_model", lambda url: "m")
    monkeypatch.setattr(live, "chat", lambda url, model, m, n: Answer("x", 10, 11, 0.2))  # 10 decode tokens, 0.2 s
    w = _window(40, (20, 8, 2))
    w.answers = [Answer("a", 10, 5, 0.6), Answer("b", 12, 5, 0.6)]  # 1.2 s over 40 rounds: 0.03 s a round
    t = _plain_timing("http://plain", [[{"role": "user", "content": "q"}]] * 2, 11, w)
    assert t["s_per_round"] == pytest.approx(0.03) and t["plain_s_per_token"] == pytest.approx(0.02)
    assert t["round_cost"] == pytest.approx(1.5)
