"""Discrete-event simulation of rollout and training for one manifest.

The model, one event heap, deterministic for a seed:

- **Episodes** take a concurrency slot, wait for the sandbox creation rate limit, start the
  sandbox (log-normal startup of the provider profile), install the agent, then run turns: an
  LLM call through the rollout workers (a FIFO pool of ``workers`` processes, each spending a
  fixed CPU time per call), the engine (``agentrl.sim.engine_model``), then a tool call. Caps
  end an episode as ``truncated`` (turns, trajectory tokens, engine context) and its tests
  still run; a wall-clock limit ends it as ``agent_timeout``; an LLM timeout or a sampled
  infrastructure failure is an ``infra_error``, retried within the failure policy and never
  trained on.
- **Episode shapes**: a share of agents submits after a few turns, the rest loop until a cap;
  tokens per turn, tool and test times are log-normal with per-episode and per-task factors,
  which is where the long tail comes from. A call may run away (no stop token) and decode
  until a cap.
- **Training**: ``sync`` (batch, then train), ``one_step`` (Miles ``train_async``: the next
  batch is generated while this one trains, but each batch waits for its slowest member) or
  ``full_async`` (episodes start continuously under the staleness bound; the trainer takes
  the first complete groups). Train time is linear in the step's tokens; weight sync pauses
  the engines.

Called by ``agentrl.sim.plan`` and ``agentrl.sim.calibration``. Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.sim.engine_model import Engine, Request
from agentrl.sim.params import EpisodeShape, LoopMode, SimOverrides, SimParams
from agentrl.sim.static_plan import StaticPlan

#: Terminal classes (the runtime's ``TerminalClass`` values) plus how a truncation happened.
COMPLETED, TRUNCATED, AGENT_TIMEOUT, INFRA_ERROR = (
    "completed", "truncated", "agent_timeout", "infra_error")


class StepBreakdown(BaseModel):
    """Mean seconds per training step, by what the trainer was doing."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    wait_for_rollout: float
    """Waiting for enough finished trajectories."""
    logprob_recompute: float
    """Recomputing log-probs of the batch under the trainer's weights."""
    actor_update: float
    """Forward and backward passes and the optimizer step."""
    weight_sync: float
    """Pushing weights to the engines (reported apart, as the report does)."""


class SimResult(BaseModel):
    """What one simulation measured."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    loop_mode: LoopMode
    """Loop simulated."""
    simulated_seconds: float
    """Simulated time."""
    trajectories_per_hour: float
    """Finished trajectories (not infra errors) per hour in the measurement window."""
    step_seconds: float | None
    """Mean training step (wait + log-prob + actor update; weight sync apart), or None when
    fewer than two steps ran."""
    step_breakdown: StepBreakdown | None
    """Mean step broken down."""
    steps: int
    """Training steps completed."""
    rollout_tail_share: float | None
    """Share of a batch's rollout time after 90% of its trajectories finished (batch modes)."""
    engine_idle_share: float
    """Share of engine time with nothing to decode."""
    trainer_idle_share: float
    """Share of trainer time spent waiting for rollout."""
    kv_usage_mean: float
    """Mean KV pool usage over engines and time."""
    kv_usage_peak: float
    """Highest KV pool usage of any engine."""
    running_per_engine_mean: float
    """Mean requests decoding per engine."""
    engine_queue_mean: float
    """Mean requests waiting per engine."""
    llm_latency_mean: float
    """Mean LLM call latency as the agent sees it (s)."""
    proxy_wait_mean: float
    """Mean wait for a rollout worker process per call (s)."""
    engine_queue_wait_mean: float
    """Mean wait for admission at the engine per call (s)."""
    sandbox_startup_wait_mean: float
    """Mean wait for the sandbox creation rate limit per episode (s)."""
    concurrency_mean: float
    """Mean episodes in flight."""
    admission_blocked_share: float
    """Share of time a free slot stayed empty because of the staleness bound."""
    episode_seconds_mean: float
    """Mean episode duration, slot taken to slot freed (s)."""
    llm_share_of_episode: float
    """Share of an episode's time spent in LLM calls."""
    tokens_per_trajectory_mean: float
    """Mean tokens of a finished trajectory."""
    turn_cap_share: float
    """Share of finished trajectories that hit the turn cap."""
    token_cap_share: float
    """Share of finished trajectories that hit a token or context cap."""
    class_counts: dict[str, int]
    """Finished episodes by terminal class (infra errors counted per attempt)."""
    llm_timeouts: int
    """LLM calls abandoned at the client timeout."""
    kv_retractions: int
    """Requests retracted because the KV pool filled."""
    runaways_resident_at_first_stall: int | None
    """Runaway generations holding the pool the first time a queued request could not get KV."""
    completion_times: list[float]
    """Episode durations of finished trajectories (s), for the length distribution chart."""
    trajectory_tokens: list[float]
    """Tokens of finished trajectories, for the length distribution chart."""


# ------------------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Group:
    gid: int
    batch: int
    remaining: int
    results: list[_Episode] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class _Episode:
    group: _Group
    retries_left: int
    slowness: float
    verbosity: float
    submit_turn: int | None
    turn: int = 0
    ctx: float = 0.0
    started: float = 0.0
    llm_time: float = 0.0
    call_start: float = 0.0
    proxy_wait: float = 0.0
    engine: int = 0
    request: Request | None = None
    outcome: str = ""
    cap: str = ""
    finished: float = 0.0
    infra: bool = False


def _lognormal_mean(rng: random.Random, mean: float, sigma: float) -> float:
    """A log-normal draw with the given *mean* (not median)."""
    if sigma <= 0:
        return mean
    return mean * math.exp(rng.gauss(-0.5 * sigma * sigma, sigma))


def loop_mode_for(job: AgentRLJob, overrides: SimOverrides) -> LoopMode:
    """The loop a manifest runs: agentrl is fully asynchronous unless maxStaleness is 0."""
    if overrides.loop_mode is not None:
        return overrides.loop_mode
    return LoopMode.SYNC if job.spec.trainer.async_.max_staleness == 0 else LoopMode.FULL_ASYNC


class Simulation:
    """One run. ``Simulation(job, static, params, overrides).run()`` returns a ``SimResult``."""

    def __init__(self, job: AgentRLJob, static: StaticPlan, params: SimParams,
                 overrides: SimOverrides | None = None) -> None:
        self.job = job
        self.spec = job.spec
        self.static = static
        self.params = params
        self.ov = overrides or SimOverrides()
        self.shape: EpisodeShape = params.episode.model_copy(update=self.ov.episode)
        profile_name = self.ov.sandbox_profile or self.spec.sandbox.provider.value
        self.profile = params.sandbox_profiles[profile_name]
        self.mode = loop_mode_for(job, self.ov)
        self.rng = random.Random(params.sim.seed)
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.now = 0.0
        ep = params.engine
        inf = self.spec.inference
        self.engines = [
            Engine(index=i, pool=static.kv_pool_tokens_per_engine,
                   max_running=inf.max_running_requests,
                   overhead_s=static.decode_overhead_seconds,
                   per_seq_s=static.decode_per_sequence_seconds,
                   kv_s_per_token=static.decode_kv_seconds_per_token,
                   reserve=ep.admission_reserve_tokens, refresh_s=ep.rate_refresh_seconds)
            for i in range(inf.engines)
        ]
        self.engine_load = [0] * inf.engines  # episodes pinned per engine (cache-aware routing)
        self.proxy_free = [0.0] * max(1, static.proxy_processes)
        self.proxy_s = params.rollout.seconds_per_llm_call
        self.next_create = 0.0
        self.slots_free = static.effective_concurrency
        self.in_flight = 0
        self.pending: deque[_Episode] = deque()
        self.groups_opened = 0
        self.group_size = self.spec.rollout.group_size
        self.groups_per_step = self.spec.trainer.trajectories_per_step // self.group_size
        self.version = 0
        # trainer
        self.ready: deque[_Group] = deque()
        self.trainer_busy = False
        self.trainer_free_since = 0.0
        self.step_records: list[tuple[float, float, float, float]] = []
        self.batch = 0
        self.batch_started: dict[int, float] = {}
        self.batch_finish_times: dict[int, list[float]] = {}
        self.batch_groups_left: dict[int, int] = {}
        self.batch_groups: dict[int, list[_Group]] = {}
        self.tail_shares: list[float] = []
        self.awaiting_batch: int | None = None
        self.batch_done_at: dict[int, float] = {}
        self.sync_started = 0.0
        # measurement
        self.t_measure = params.sim.warmup_seconds
        self.t_end_window = params.sim.warmup_seconds + params.sim.measure_seconds
        self.finished: list[_Episode] = []
        self.class_counts: dict[str, int] = {}
        self.llm_latencies = 0.0
        self.llm_calls = 0
        self.proxy_waits = 0.0
        self.create_waits: list[float] = []
        self.conc_integral = 0.0
        self.blocked_integral = 0.0
        self.t_last = 0.0
        self.trainer_wait_total = 0.0
        self.trainer_span = 0.0
        sync = self.spec.trainer.weight_sync.mode.value
        self.sync_seconds = (params.trainer.weight_sync_seconds_disk if sync == "disk"
                             else params.trainer.weight_sync_seconds_distributed)

    # ------------------------------------------------------------------ plumbing

    def _push(self, t: float, kind: int, obj: object) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, obj))

    def _schedule_engine(self, eng: Engine) -> None:
        t_next = eng.next_event(self.now)
        eng.version += 1
        if t_next is not None:
            self._push(t_next, _ENGINE, (eng, eng.version))

    def _account(self, t: float) -> None:
        if t > self.t_last:
            lo, hi = max(self.t_last, self.t_measure), min(t, self.t_end_window)
            if hi > lo:
                self.conc_integral += self.in_flight * (hi - lo)
                if self.slots_free > 0 and not self.pending and self.mode == LoopMode.FULL_ASYNC:
                    self.blocked_integral += hi - lo
            self.t_last = t

    # ------------------------------------------------------------------ episodes

    def _new_group(self, batch: int) -> None:
        group = _Group(gid=self.groups_opened, batch=batch, remaining=self.group_size)
        self.groups_opened += 1
        self.batch_groups.setdefault(batch, []).append(group)
        slowness = _lognormal_mean(self.rng, 1.0, self.shape.task_slowness_sigma)
        retries = self.spec.rollout.failure_policy.infra_retries
        for _ in range(self.group_size):
            self.pending.append(self._make_episode(group, slowness, retries))

    def _make_episode(self, group: _Group, slowness: float, retries: int) -> _Episode:
        s, rng = self.shape, self.rng
        submit = None
        if rng.random() < s.submit_share:
            submit = max(1, round(s.submit_turns_median
                                  * math.exp(rng.gauss(0.0, s.submit_turns_sigma))))
        return _Episode(group=group, retries_left=retries, slowness=slowness,
                        verbosity=_lognormal_mean(rng, 1.0, s.verbosity_sigma),
                        submit_turn=submit)

    def _may_open_group(self) -> bool:
        if self.mode != LoopMode.FULL_ASYNC:
            return False
        staleness = self.spec.trainer.async_.max_staleness
        # Admission control: no episode starts whose policy would lag more than maxStaleness
        # versions by the time its group is trained.
        return self.groups_opened < (self.version + staleness + 1) * self.groups_per_step

    def _fill_slots(self) -> None:
        while self.slots_free > 0:
            if not self.pending and self._may_open_group():
                self._new_group(batch=-1)
            if not self.pending:
                return
            self._start_episode(self.pending.popleft())

    def _start_episode(self, ep: _Episode) -> None:
        self.slots_free -= 1
        self.in_flight += 1
        ep.started = self.now
        ep.turn, ep.ctx, ep.llm_time = 0, float(self.shape.prompt_tokens), 0.0
        t_create = max(self.now, self.next_create)
        self.next_create = t_create + 1.0 / self.static.sandbox_creates_per_second
        if self.now >= self.t_measure:
            self.create_waits.append(t_create - self.now)
        p = self.profile
        sigma = math.log(p.startup_p99_seconds / p.startup_median_seconds) / 2.326
        startup = p.startup_median_seconds * math.exp(self.rng.gauss(0.0, sigma))
        install = p.install_seconds * ep.slowness
        ep.engine = min(range(len(self.engines)), key=self.engine_load.__getitem__)
        self.engine_load[ep.engine] += 1
        self._push(t_create + startup + install, _CALL, ep)

    def _call(self, ep: _Episode) -> None:
        """The agent asks the model for its next action."""
        roll = self.spec.rollout
        inf = self.spec.inference
        s, rng = self.shape, self.rng
        if self.now - ep.started > roll.episode_timeout_seconds:
            self._finish(ep, AGENT_TIMEOUT)
            return
        ep.call_start = self.now
        limit = min(roll.max_tokens_per_turn, inf.context_length - ep.ctx)
        runaway = rng.random() < s.runaway_probability
        if runaway:
            natural = rng.uniform(s.runaway_tokens_min, s.runaway_tokens_max)
        else:
            natural = _lognormal_mean(rng, s.output_tokens_mean * ep.verbosity,
                                      s.output_tokens_sigma)
        need = max(1.0, min(natural, limit))
        req = Request(owner=ep, ctx=ep.ctx, need=need, submitted=0.0, runaway=runaway)
        ep.request = req
        # The rollout workers: FIFO over `workers` processes, a fixed CPU time per call.
        start = max(self.now, self.proxy_free[0])
        heapq.heapreplace(self.proxy_free, start + self.proxy_s)
        ep.proxy_wait = start - self.now
        arrive = start + self.proxy_s
        if arrive > self.now:
            self._push(arrive, _SUBMIT, ep)
        else:
            self._submit(ep)

    def _submit(self, ep: _Episode) -> None:
        req = ep.request
        assert req is not None
        req.submitted = self.now
        eng = self.engines[ep.engine]
        eng.submit(req, self.now)
        self._engine_process(eng)

    def _engine_process(self, eng: Engine) -> None:
        for req in eng.process(self.now):
            self._reply(req.owner, req)
        self._schedule_engine(eng)

    def _reply(self, ep: _Episode, req: Request) -> None:
        roll = self.spec.rollout
        inf = self.spec.inference
        s, rng = self.shape, self.rng
        out = req.ctx + req.need - ep.ctx  # decoded tokens (retractions moved some into ctx)
        # Prefix caching: only the system prompt (first turn) and the last observation are new.
        new_tokens = (s.prompt_tokens if ep.turn == 0 else 0) + s.observation_tokens_mean
        prefill = new_tokens / self.params.engine.prefill_tokens_per_second
        latency = self.now - ep.call_start + prefill + self.profile.llm_tunnel_seconds
        ep.llm_time += latency
        if self.now >= self.t_measure:
            self.llm_latencies += latency
            self.proxy_waits += ep.proxy_wait
            self.llm_calls += 1
        ep.ctx += out
        ep.turn += 1
        t_back = self.now + prefill + self.profile.llm_tunnel_seconds
        if ep.ctx >= inf.context_length - 1 or ep.ctx >= roll.max_trajectory_tokens:
            ep.cap = "tokens"
            self._tests(ep, t_back)
            return
        tool = _lognormal_mean(rng, s.tool_seconds_mean * ep.slowness, s.tool_seconds_sigma)
        if ep.submit_turn is not None and ep.turn >= ep.submit_turn:
            self._tests(ep, t_back + tool)
            return
        obs = _lognormal_mean(rng, s.observation_tokens_mean * ep.verbosity,
                              s.observation_tokens_sigma)
        ep.ctx += obs
        if ep.ctx >= roll.max_trajectory_tokens:
            ep.cap = "tokens"
            self._tests(ep, t_back + tool)
        elif ep.turn >= roll.max_turns:
            ep.cap = "turns"
            self._tests(ep, t_back + tool)
        else:
            self._push(t_back + tool, _CALL, ep)

    def _tests(self, ep: _Episode, t: float) -> None:
        self._push(t + self.profile.test_seconds * ep.slowness, _END, ep)

    def _end(self, ep: _Episode) -> None:
        if self.rng.random() < self.shape.infra_error_rate:
            self._finish(ep, INFRA_ERROR)
        elif ep.cap:
            self._finish(ep, TRUNCATED)
        else:
            self._finish(ep, COMPLETED)

    def _finish(self, ep: _Episode, outcome: str) -> None:
        ep.outcome, ep.finished = outcome, self.now
        self.slots_free += 1
        self.in_flight -= 1
        self.engine_load[ep.engine] -= 1
        if ep.started >= 0 and self.t_measure <= self.now <= self.t_end_window:
            self.class_counts[outcome] = self.class_counts.get(outcome, 0) + 1
        if outcome == INFRA_ERROR and ep.retries_left > 0:
            # Retried as a fresh attempt of the same group member, at the head of the line.
            retry = _Episode(group=ep.group, retries_left=ep.retries_left - 1,
                             slowness=ep.slowness, verbosity=ep.verbosity,
                             submit_turn=ep.submit_turn)
            self.pending.appendleft(retry)
        else:
            if outcome != INFRA_ERROR:
                self.finished.append(ep)
                ep.group.results.append(ep)
            ep.group.remaining -= 1
            if ep.group.remaining == 0:
                self._group_done(ep.group)
        self._fill_slots()

    # ------------------------------------------------------------------ training

    def _group_done(self, group: _Group) -> None:
        if self.mode == LoopMode.FULL_ASYNC:
            if len(group.results) >= 2:  # a group needs two members for an advantage
                self.ready.append(group)
            else:
                self.groups_opened -= 1  # refill: admission counts it as not started
            self._try_train_async()
            return
        b = group.batch
        for ep in group.results:
            self.batch_finish_times[b].append(ep.finished)
        self.batch_groups_left[b] -= 1
        if self.batch_groups_left[b] == 0:
            self._batch_done(b)

    def _train_seconds(self, groups: list[_Group]) -> tuple[float, float]:
        tokens = sum(ep.ctx for g in groups for ep in g.results)
        gpus = max(1, self.static.trainer_gpus)
        tp = self.params.trainer
        return (tokens / (tp.logprob_tokens_per_second_per_gpu * gpus),
                tokens / (tp.actor_tokens_per_second_per_gpu * gpus))

    def _try_train_async(self) -> None:
        if self.trainer_busy:
            return
        have = sum(len(g.results) for g in self.ready)
        if have < self.spec.trainer.trajectories_per_step:
            return
        groups: list[_Group] = []
        count = 0
        while self.ready and count < self.spec.trainer.trajectories_per_step:
            g = self.ready.popleft()
            groups.append(g)
            count += len(g.results)
        self._start_training(groups, batch=None)

    def _start_training(self, groups: list[_Group], batch: int | None,
                        wait: float | None = None) -> None:
        logprob, actor = self._train_seconds(groups)
        if wait is None:
            wait = self.now - self.trainer_free_since
        self.trainer_busy = True
        self._push(self.now + logprob + actor, _TRAIN_DONE, (wait, logprob, actor, batch))

    def _train_done(self, payload: tuple[float, float, float, int | None]) -> None:
        wait, logprob, actor, batch = payload
        self.step_records.append((wait, logprob, actor, self.sync_seconds))
        if self.mode == LoopMode.ONE_STEP:
            # Miles train_async: weights are pushed only after the batch being generated ends.
            self.trainer_busy = False
            self.trainer_free_since = self.now
            self.awaiting_batch = (batch or 0) + 1
            if self.awaiting_batch in self.batch_done_at:
                self._start_sync()
            return
        self._start_sync()

    def _start_sync(self) -> None:
        self.sync_started = self.now
        for eng in self.engines:
            eng.advance(self.now)
            eng.paused = True
            self._schedule_engine(eng)
        self._push(self.now + self.sync_seconds, _SYNC_DONE, None)

    def _sync_done(self) -> None:
        self.version += 1
        for eng in self.engines:
            eng.advance(self.now)
            eng.paused = False
            self._engine_process(eng)
        if self.mode == LoopMode.ONE_STEP:
            pass  # the trainer's idle time started when its last step ended
        else:
            self.trainer_busy = False
            self.trainer_free_since = self.now
        if self.mode == LoopMode.FULL_ASYNC:
            self._fill_slots()
            self._try_train_async()
        elif self.mode == LoopMode.SYNC:
            self._start_batch()
        else:
            # The trainer waited from its last step's end until this batch was generated;
            # the weight push in between is accounted apart.
            b = self.awaiting_batch or 0
            wait = max(0.0, self.sync_started - self.trainer_free_since)
            self._start_batch()
            self._start_training(self.batch_groups[b], batch=b, wait=wait)

    def _start_batch(self) -> None:
        b = self.batch
        self.batch += 1
        self.batch_started[b] = self.now
        self.batch_finish_times[b] = []
        self.batch_groups_left[b] = self.groups_per_step
        for _ in range(self.groups_per_step):
            self._new_group(batch=b)
        self._fill_slots()

    def _batch_done(self, b: int) -> None:
        self.batch_done_at[b] = self.now
        times = sorted(self.batch_finish_times[b])
        if times:
            span = self.now - self.batch_started[b]
            t90 = times[max(0, math.ceil(0.9 * len(times)) - 1)]
            if span > 0:
                self.tail_shares.append((self.now - t90) / span)
        if self.mode == LoopMode.SYNC:
            self.trainer_free_since = self.batch_started[b]
            self._start_training(self.batch_groups[b], batch=b)
        elif b == 0:
            # First batch: nothing to overlap with yet.
            self._start_batch()
            self._start_training(self.batch_groups[0], batch=0)
        elif self.awaiting_batch == b and not self.trainer_busy:
            self._start_sync()

    # ------------------------------------------------------------------ main loop

    def run(self) -> SimResult:
        """Simulate until the window and the step count are both covered."""
        if self.mode == LoopMode.FULL_ASYNC:
            self._fill_slots()
        else:
            self._start_batch()
        control = self.params.sim
        want_steps = 1 + (control.measure_steps_async if self.mode == LoopMode.FULL_ASYNC
                          else control.measure_steps)
        timeout = float(self.spec.rollout.llm_timeout_seconds)
        while self.heap:
            t, _, kind, obj = heapq.heappop(self.heap)
            if t > control.max_sim_seconds:
                break
            if t >= self.t_end_window and len(self.step_records) >= want_steps:
                break
            self._account(t)
            if self.now < self.t_measure <= t:
                for eng in self.engines:
                    eng.advance(self.t_measure)
                    eng.measuring = True
            self.now = t
            if kind == _ENGINE:
                self._engine_event(obj, timeout)  # type: ignore[arg-type]
            elif kind == _CALL:
                self._call(obj)  # type: ignore[arg-type]
            elif kind == _SUBMIT:
                self._submit(obj)  # type: ignore[arg-type]
            elif kind == _END:
                self._end(obj)  # type: ignore[arg-type]
            elif kind == _TRAIN_DONE:
                self._train_done(obj)  # type: ignore[arg-type]
            elif kind == _SYNC_DONE:
                self._sync_done()
        for eng in self.engines:
            eng.advance(min(self.now, self.t_end_window))
        return self._result()

    def _engine_event(self, payload: tuple[Engine, int], timeout: float) -> None:
        eng, version = payload
        if version != eng.version:
            return  # superseded by a later reschedule
        for req in eng.expired(self.now, timeout):
            # The client gave up: an infra error, retried within the failure policy.
            eng.cancel(req, self.now)
            owner = req.owner
            owner.llm_time += self.now - owner.call_start
            self._finish(owner, INFRA_ERROR)
        self._engine_process(eng)

    # ------------------------------------------------------------------ results

    def _result(self) -> SimResult:
        window_end = min(self.now, self.t_end_window)
        window = max(1e-9, window_end - self.t_measure)
        in_window = [e for e in self.finished if self.t_measure <= e.finished <= window_end]
        if self.mode != LoopMode.FULL_ASYNC and len(self.step_records) >= 2:
            # Batch modes: throughput over whole steps, so a window edge does not cut a batch.
            done = sorted(self.batch_done_at.items())
            (b0, t0), (b1, t1) = done[0], done[-1]
            n = sum(len(self.batch_finish_times[b]) for b, _ in done[1:])
            tph = n / max(1e-9, t1 - t0) * 3600 if b1 > b0 else 0.0
        else:
            tph = len(in_window) / window * 3600
        steps = self.step_records[1:] if len(self.step_records) > 1 else []
        breakdown = None
        step_s = None
        if steps:
            k = len(steps)
            breakdown = StepBreakdown(
                wait_for_rollout=sum(r[0] for r in steps) / k,
                logprob_recompute=sum(r[1] for r in steps) / k,
                actor_update=sum(r[2] for r in steps) / k,
                weight_sync=sum(r[3] for r in steps) / k,
            )
            step_s = breakdown.wait_for_rollout + breakdown.logprob_recompute + \
                breakdown.actor_update
        engs = [e.stats for e in self.engines]
        eng_time = sum(s.window_seconds for s in engs) or 1e-9
        pool = self.static.kv_pool_tokens_per_engine
        sample = in_window or self.finished
        n_s = max(1, len(sample))
        durations = [e.finished - e.started for e in sample]
        llm = sum(e.llm_time for e in sample)
        stall = [s.runaways_resident_at_first_stall for s in engs
                 if s.runaways_resident_at_first_stall is not None]
        admitted = sum(s.admitted for s in engs) or 1
        return SimResult(
            loop_mode=self.mode,
            simulated_seconds=self.now,
            trajectories_per_hour=tph,
            step_seconds=step_s,
            step_breakdown=breakdown,
            steps=len(self.step_records),
            rollout_tail_share=(sum(self.tail_shares[1:]) / len(self.tail_shares[1:])
                                if len(self.tail_shares) > 1 else
                                (self.tail_shares[0] if self.tail_shares else None)),
            engine_idle_share=1.0 - sum(s.busy_seconds for s in engs) / eng_time,
            trainer_idle_share=(sum(r[0] for r in steps) / max(1e-9, sum(
                r[0] + r[1] + r[2] + r[3] for r in steps))) if steps else 0.0,
            kv_usage_mean=sum(s.kv_token_seconds for s in engs) / eng_time / pool,
            kv_usage_peak=max((s.kv_peak for s in engs), default=0.0),
            running_per_engine_mean=sum(s.running_seconds for s in engs) / eng_time,
            engine_queue_mean=sum(s.queued_seconds for s in engs) / eng_time,
            llm_latency_mean=self.llm_latencies / max(1, self.llm_calls),
            proxy_wait_mean=self.proxy_waits / max(1, self.llm_calls),
            engine_queue_wait_mean=sum(s.queue_wait_total for s in engs) / admitted,
            sandbox_startup_wait_mean=(sum(self.create_waits) / len(self.create_waits)
                                       if self.create_waits else 0.0),
            concurrency_mean=self.conc_integral / window,
            admission_blocked_share=self.blocked_integral / window,
            episode_seconds_mean=sum(durations) / n_s,
            llm_share_of_episode=llm / max(1e-9, sum(durations)),
            tokens_per_trajectory_mean=sum(e.ctx for e in sample) / n_s,
            turn_cap_share=sum(1 for e in sample if e.cap == "turns") / n_s,
            token_cap_share=sum(1 for e in sample if e.cap == "tokens") / n_s,
            class_counts=self.class_counts,
            llm_timeouts=sum(s.timeouts for s in engs),
            kv_retractions=sum(s.retractions for s in engs),
            runaways_resident_at_first_stall=max(stall) if stall else None,
            completion_times=durations,
            trajectory_tokens=[e.ctx for e in sample],
        )


_ENGINE, _CALL, _SUBMIT, _END, _TRAIN_DONE, _SYNC_DONE = range(6)


def simulate(job: AgentRLJob, static: StaticPlan, params: SimParams,
             overrides: SimOverrides | None = None) -> SimResult:
    """Run one simulation of ``job``."""
    return Simulation(job, static, params, overrides).run()
