"""In-process simulation of the Ape-X loop on CartPole-v1, to choose hyperparameters for the real fleet.

One process plays every role, in lockstep and without gRPC:
  * `num_actors` actors, each one CartPole env with its fixed Ape-X epsilon, sharing one copy of the weights that
    is refreshed from the learner every `actor_sync_steps` actor steps (the staleness of a real actor's copy);
    n-step transitions (`apexrl.algorithms.nstep`) are inserted in batches of `actor_batch` with initial priorities =
    |TD| from the actor's copy (`td_error_abs(actor_net, actor_net, ...)`);
  * a proportional prioritized replay (plain numpy cumsum sampler; the fleet uses sum-tree shards);
  * a learner doing double DQN with a dueling head (`apexrl.learner.{networks,losses}`), Adam, gradient clipping,
    hard or soft target updates, at `replay_ratio` updates per environment step once `learning_starts`
    transitions are stored (the fleet enforces this with the shards' samples-per-insert rate limiter, or gets it
    from the ratio of learner to actor throughput).
Every `eval_every` environment steps the learner's current network plays `eval_episodes` greedy episodes on a
vectorised CartPole; "solved" means their mean return is >= `solve_return`.

The printed JSON line gives env steps, learner updates and simulation wall time (evaluation excluded) at the
first solve, plus how the following evaluations went. `fleet_seconds` estimates the real fleet's time to solve as
max(env_steps / actor_steps_per_s, updates / learner_updates_per_s).

Usage (the defaults are the recommended configuration):
    .venv/bin/python bench/tune_cartpole.py --seed 0
    .venv/bin/python bench/tune_cartpole.py --target-period 500 --capacity 100000 --hidden 128,128 --seed 0

Results (2 cores shared with other work, torch 1 thread; "solve" = 100 greedy episodes with mean >= 475):
  Recommended: 4 actors (Ape-X eps 0.4 .. 0.4^8), n = 3, gamma 0.99, dueling (256, 256), Adam lr 1e-3, batch 256,
  Huber delta 1, grad clip 10, hard target copy every 100 updates, 0.125 updates per env step, replay 25k,
  priority alpha 0.6, beta 0.4 -> 1 over 10k updates, actor weights refreshed every 100 steps per actor.
  Seeds 0-9 all solved: env steps 34k 28k 6k 36k 44k 28k 46k 66k 62k 44k (median 40k, max 66k), updates 4000
  3250 500 4250 5250 3250 5500 8000 7500 5250 (median 4750), simulated wall 5-79 s; 44 of the 50 evaluations
  after the first solve also scored >= 475.
  What mattered: the target period. With hard copies every P updates, values propagate about n steps per copy:
  at P = 500 (a run with lr 5e-4), Q(s_0) was ~26 after 4,750 updates where the true value is ~75, so the greedy policy cannot see the
  cart drifting out of bounds 100-200 steps ahead, and returns plateau at 120-200 for tens of thousands of steps
  (P = 500, 30 runs over other settings: 7 unsolved within 150k env steps, first solves 8k-142k, median ~70k,
  the early ones collapsing at once). P = 100 fixed that; P = 50 solved too but held less well. Hidden 256 beat
  128; replay 25k beat 100k (seeds 0-4 at 100k: 50k 62k 6k 86k 38k); lr 5e-4 solved sooner but held worse (9 of
  25 later evaluations); MSE-like Huber (delta 10-100), uniform replay, soft targets (tau 0.005) and wider
  epsilons (alpha 3) were no better in 2-3 seed tests; 0.0625 updates per env step used fewer updates (375-5000) but
  solved only 4 of 5 seeds within 150k env steps (8k 50k 66k 82k).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from apexrl.algorithms.dqn.exploration import apex_epsilon
from apexrl.algorithms.dqn.losses import double_dqn_loss, td_error_abs
from apexrl.algorithms.dqn.networks import DuelingQNetwork
from apexrl.algorithms.nstep import NStepWriter, Transition, item_columns
from apexrl.algorithms.torsos import state_dict_to_numpy


@dataclass
class Config:
    """One experiment.

    Attributes are grouped as in the fleet: actors, returns, learner, replay, evaluation and budget.
    """

    # Actors.
    num_actors: int = 4
    eps_base: float = 0.4
    eps_alpha: float = 7.0
    actor_sync_steps: int = 100  # each actor refreshes its weights every this many of its own env steps
    actor_batch: int = 32  # transitions per insert; initial priorities are computed per batch
    # Returns.
    n_step: int = 3
    gamma: float = 0.99
    # Learner.
    hidden: tuple[int, ...] = (256, 256)
    lr: float = 1e-3
    lr_end: float = 1e-4  # reached after lr_decay_updates updates (linear decay)
    lr_decay_updates: int = 0  # 0 keeps lr constant
    adam_eps: float = 1e-8
    batch_size: int = 256
    replay_ratio: float = 0.125  # learner updates per environment step
    learning_starts: int = 2_000  # stored transitions before the first update
    target_period: int = 100  # hard target copy every this many updates (ignored when tau > 0)
    tau: float = 0.0  # soft target update rate per update; 0 means hard copies
    grad_clip: float = 10.0
    huber_delta: float = 1.0
    sample_ahead: int = (
        0  # batches sampled this many updates before they are trained on (the fleet's prefetch)
    )
    priority_delay: int = 0  # a batch's new priorities land this many updates after it trained (coalescing)
    # Replay.
    capacity: int = 25_000  # the whole fleet's replay (split over shards in the real system)
    priority_alpha: float = 0.6
    beta_start: float = 0.4
    beta_updates: int = 10_000  # beta grows linearly to 1 over this many updates
    priority_eps: float = 1e-6
    # Evaluation and budget.
    eval_every: int = 2_000
    eval_episodes: int = 100
    solve_return: float = 475.0
    post_solve_evals: int = 5  # evaluations to keep going after the first solve, to see whether it holds
    max_env_steps: int = 120_000
    max_seconds: float = 540.0
    seed: int = 0
    save: str = ""  # write the final online weights here (.npz), if set
    # Throughput assumed for the fleet estimate.
    fleet_actor_steps_per_s: float = 600.0
    fleet_learner_updates_per_s: float = 50.0


class ProportionalReplay:
    """Columnar FIFO ring with proportional prioritized sampling (Schaul et al., 2016), numpy only."""

    def __init__(self, capacity: int, obs_dim: int, alpha: float, eps: float) -> None:
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.cols = {
            "obs": np.zeros((capacity, obs_dim), np.float32),
            "action": np.zeros(capacity, np.int64),
            "reward": np.zeros(capacity, np.float32),
            "discount": np.zeros(capacity, np.float32),
            "next_obs": np.zeros((capacity, obs_dim), np.float32),
        }
        self.leaf = np.zeros(capacity, np.float64)  # priority ** alpha
        self.size = 0
        self.cursor = 0

    def insert(self, cols: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        slots = (self.cursor + np.arange(len(priorities))) % self.capacity
        for name, column in cols.items():
            self.cols[name][slots] = column
        self.leaf[slots] = (priorities + self.eps) ** self.alpha
        self.cursor = int(slots[-1] + 1) % self.capacity
        self.size = min(self.size + len(priorities), self.capacity)

    def sample(
        self, batch_size: int, beta: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Stratified proportional sample: (slots, columns, importance weights normalised by the max weight)."""
        leaf = self.leaf[: self.size]
        cumulative = np.cumsum(leaf)
        total = cumulative[-1]
        targets = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        slots = np.minimum(np.searchsorted(cumulative, targets, side="right"), self.size - 1)
        probs = leaf[slots] / total
        max_weight = (self.size * leaf.min() / total) ** -beta
        weights = (self.size * probs) ** -beta / max_weight
        return slots, {name: col[slots] for name, col in self.cols.items()}, weights.astype(np.float32)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.leaf[slots] = (priorities + self.eps) ** self.alpha


def _tensors(cols: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(col) for name, col in cols.items()}


def evaluate(net: DuelingQNetwork, episodes: int, seed: int) -> tuple[np.ndarray, float]:
    """Returns of `episodes` greedy episodes (the first episode of each env of a vectorised CartPole), and the
    mean max_a Q(s_0, a) over their first states: with gamma 0.99 it nears 100 once values have propagated over
    the whole episode, and stalls far below when target updates are too slow (see `target_period`)."""
    env = gym.make_vec("CartPole-v1", num_envs=episodes, vectorization_mode="vector_entry_point")
    obs, _ = env.reset(seed=seed)
    with torch.no_grad():
        start_q = float(net(torch.from_numpy(obs)).max(dim=1).values.mean())
    returns = np.zeros(episodes)
    alive = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while alive.any():
            actions = net(torch.from_numpy(obs)).argmax(dim=1).numpy()
            obs, reward, terminated, truncated, _ = env.step(actions)
            returns += reward * alive
            alive &= ~(terminated | truncated)
    env.close()
    return returns, start_q


class Simulation:
    """The whole loop's state, stepped in lockstep by `run`: actors act, the learner catches up, and every
    `eval_every` env steps the online network is evaluated."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.envs = [gym.make("CartPole-v1") for _ in range(cfg.num_actors)]
        self.obs = np.stack([env.reset(seed=cfg.seed * 1000 + i)[0] for i, env in enumerate(self.envs)])
        obs_dim, self.num_actions = self.obs.shape[1], int(self.envs[0].action_space.n)
        self.epsilons = np.array(
            [apex_epsilon(i, cfg.num_actors, cfg.eps_base, cfg.eps_alpha) for i in range(cfg.num_actors)]
        )
        self.accumulators = [NStepWriter(cfg.n_step, cfg.gamma) for _ in self.envs]
        self.outbox: list[list[Transition]] = [[] for _ in self.envs]
        self.episode_returns = np.zeros(cfg.num_actors)
        self.finished_returns: list[list[float]] = [[] for _ in self.envs]

        self.online = DuelingQNetwork(obs_dim, self.num_actions, cfg.hidden)
        self.target = DuelingQNetwork(obs_dim, self.num_actions, cfg.hidden)
        self.actor_net = DuelingQNetwork(obs_dim, self.num_actions, cfg.hidden)
        self.target.load_state_dict(self.online.state_dict())
        self.actor_net.load_state_dict(self.online.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.ahead: deque = deque()  # batches sampled ahead of their update
        self.pending: deque = deque()  # (slots, priorities) not yet written back
        self.replay = ProportionalReplay(cfg.capacity, obs_dim, cfg.priority_alpha, cfg.priority_eps)

        self.env_steps = self.updates = self.tick = 0
        self.next_eval = cfg.eval_every
        self.evals: list[tuple[int, int, float, float]] = []
        self.solved_at: dict | None = None
        self.solved_eval = 0
        self.eval_seconds = 0.0
        self.start = time.perf_counter()

    def act(self) -> None:
        """Actors: one step each, one forward pass for all of them (they hold the same copy of the weights)."""
        cfg = self.cfg
        with torch.no_grad():
            q = self.actor_net(torch.from_numpy(self.obs)).numpy()
        explore = self.rng.random(cfg.num_actors) < self.epsilons
        actions = np.where(
            explore, self.rng.integers(self.num_actions, size=cfg.num_actors), q.argmax(axis=1)
        )
        for i, env in enumerate(self.envs):
            next_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            self.outbox[i] += self.accumulators[i].push(
                self.obs[i], actions[i], reward, next_obs, terminated, truncated
            )
            self.episode_returns[i] += reward
            if terminated or truncated:
                self.finished_returns[i].append(self.episode_returns[i])
                self.episode_returns[i] = 0.0
                next_obs, _ = env.reset()
            self.obs[i] = next_obs
            if len(self.outbox[i]) >= cfg.actor_batch:
                cols = item_columns(self.outbox[i])
                priorities = td_error_abs(self.actor_net, self.actor_net, **_tensors(cols)).numpy()
                self.replay.insert(cols, priorities)
                self.outbox[i] = []
        self.env_steps += cfg.num_actors
        self.tick += 1
        if self.tick % cfg.actor_sync_steps == 0:
            self.actor_net.load_state_dict(self.online.state_dict())

    def learn(self) -> None:
        """Learner: catch up with replay_ratio updates per env step since learning started."""
        cfg = self.cfg
        if self.replay.size < cfg.learning_starts:
            return
        while self.updates < cfg.replay_ratio * (self.env_steps - cfg.learning_starts):
            self.update()

    def update(self) -> None:
        cfg = self.cfg
        if cfg.lr_decay_updates > 0:
            frac = min(1.0, self.updates / cfg.lr_decay_updates)
            self.optimizer.param_groups[0]["lr"] = cfg.lr + (cfg.lr_end - cfg.lr) * frac
        beta = cfg.beta_start + (1.0 - cfg.beta_start) * min(1.0, self.updates / cfg.beta_updates)
        self.ahead.append(self.replay.sample(cfg.batch_size, beta, self.rng))
        while len(self.ahead) <= cfg.sample_ahead:
            self.ahead.append(self.replay.sample(cfg.batch_size, beta, self.rng))
        slots, cols, weights = self.ahead.popleft()
        loss, td_abs = double_dqn_loss(
            self.online,
            self.target,
            **_tensors(cols),
            weights=torch.from_numpy(weights),
            huber_delta=cfg.huber_delta,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.pending.append((slots, td_abs.numpy()))
        while len(self.pending) > cfg.priority_delay:
            self.replay.update(*self.pending.popleft())
        self.updates += 1
        if cfg.tau > 0:
            with torch.no_grad():
                for t_param, o_param in zip(self.target.parameters(), self.online.parameters(), strict=True):
                    t_param.lerp_(o_param, cfg.tau)
        elif self.updates % cfg.target_period == 0:
            self.target.load_state_dict(self.online.state_dict())

    def wall(self) -> float:
        """Simulated seconds so far (evaluation excluded)."""
        return time.perf_counter() - self.start - self.eval_seconds

    def evaluate(self) -> bool:
        """Evaluate the online network when due; True when the run should stop (solved and followed by
        `post_solve_evals` more evaluations, or out of time)."""
        cfg = self.cfg
        if self.env_steps < self.next_eval:
            return False
        self.next_eval += cfg.eval_every
        t0 = time.perf_counter()
        returns, start_q = evaluate(self.online, cfg.eval_episodes, seed=cfg.seed * 7919 + len(self.evals))
        mean_return = float(returns.mean())
        self.eval_seconds += time.perf_counter() - t0
        self.evals.append((self.env_steps, self.updates, mean_return, start_q))
        wall = self.wall()
        if self.solved_at is None and mean_return >= cfg.solve_return:
            fleet_seconds = max(
                self.env_steps / cfg.fleet_actor_steps_per_s, self.updates / cfg.fleet_learner_updates_per_s
            )
            self.solved_at = {
                "env_steps": self.env_steps,
                "updates": self.updates,
                "sim_seconds": round(wall, 1),
                "fleet_seconds": round(fleet_seconds, 1),
            }
            self.solved_eval = len(self.evals)
        if self.solved_at is not None and len(self.evals) - self.solved_eval >= cfg.post_solve_evals:
            return True
        return wall > cfg.max_seconds

    def report(self) -> dict:
        cfg, solved_at = self.cfg, self.solved_at
        after = [e[2] for e in self.evals if solved_at is not None and e[0] > solved_at["env_steps"]]
        recent = [np.mean(r[-20:]) if r else math.nan for r in self.finished_returns]
        return {
            "config": {k: v for k, v in dataclasses.asdict(cfg).items() if v != getattr(Config, k, None)},
            "solved": solved_at is not None,
            "solved_at": solved_at,
            "post_solve_evals": after,
            "post_solve_held": (sum(r >= cfg.solve_return for r in after), len(after)),
            "final": {
                "env_steps": self.env_steps,
                "updates": self.updates,
                "sim_seconds": round(self.wall(), 1),
            },
            "actor_recent_returns": [round(float(r), 1) for r in recent],
            "evals": [(s, u, round(r, 1), round(q, 1)) for s, u, r, q in self.evals],
        }


def run(cfg: Config) -> dict:
    sim = Simulation(cfg)
    while sim.env_steps < cfg.max_env_steps:
        sim.act()
        sim.learn()
        if sim.evaluate():
            break
    if cfg.save:
        np.savez(cfg.save, **state_dict_to_numpy(sim.online))
    return sim.report()


def _parse_args() -> Config:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for field in dataclasses.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        if field.name == "hidden":
            parser.add_argument(
                flag, type=lambda s: tuple(int(h) for h in s.split(",")), default=field.default
            )
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default)
    return Config(**vars(parser.parse_args()))


def main() -> None:
    torch.set_num_threads(1)
    cfg = _parse_args()
    print(json.dumps(run(cfg)), flush=True)


if __name__ == "__main__":
    main()
