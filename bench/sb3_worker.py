"""Stable-Baselines3 with rl-baselines3-zoo's tuned hyperparameters, timed to a greedy mean return: DQN on CartPole-v1,
TD3 on the continuous-control tasks (Pendulum-v1, LunarLanderContinuous-v3, InvertedPendulum-v5, HalfCheetah-v5),
and sb3-contrib's RecurrentPPO (the zoo's `ppo_lstm`) on CartPoleNoVel-v1, the task that needs memory.

Run by `bench/solve_race.py` with the interpreter of its own virtual environment (SB3 is not an apexrl
dependency); it imports nothing from apexrl. Every `--eval-every` env steps the current policy plays
`--eval-episodes` greedy episodes on a vectorised copy of the env; training stops at the first evaluation whose
mean return is >= `--target` (solve mode, bench/solve_race.py), or once `--max-train-seconds` of training have
passed (budget mode, bench/budget_race.py), or after `--max-steps`. Evaluation time is measured apart and left out
of `train_seconds` (the figure compared and the one the budget counts), so SB3 is not charged for the evaluation
apexrl runs in a separate process. Training ends with an evaluation of the final policy unless the last one was
already at the final step.

Prints one JSON line: solved, env_steps, train_seconds, wall_seconds (training + evaluation), final_return (the
final evaluation's mean), evaluations ([env_steps, train_seconds, mean_return] each).
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import DQN, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import NormalActionNoise
from torch import nn

# CartPole-v1 with the cart's and the pole's velocities set to 0 (apexrl's CartPoleNoVel-v1, common/env_adapters.py:
# the same masking, its observation keeps 4 entries; the zoo's drops the two): defined here because this worker
# imports nothing from apexrl.
NO_VELOCITY = "CartPoleNoVel-v1"
VELOCITY_ENTRIES = (1, 3)

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (the issue quotes them).
ZOO_CARTPOLE = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1_000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    policy_kwargs=dict(net_arch=[256, 256]),
)
ZOO_TIMESTEPS = 50_000  # the zoo's n_timesteps: sets the exploration schedule's length
# rl-baselines3-zoo hyperparams/td3.yml: Pendulum-v1 and LunarLanderContinuous use these (noise_std 0.1, normal);
# the MuJoCo tasks use the same without gamma 0.98 and the buffer cap (SB3's defaults: gamma 0.99, 1M rows).
ZOO_TD3 = {
    "Pendulum-v1": dict(
        gamma=0.98,
        buffer_size=200_000,
        learning_starts=10_000,
        gradient_steps=1,
        train_freq=1,
        learning_rate=1e-3,
        policy_kwargs=dict(net_arch=[400, 300]),
    ),
    "LunarLanderContinuous-v3": dict(
        gamma=0.98,
        buffer_size=200_000,
        learning_starts=10_000,
        gradient_steps=1,
        train_freq=1,
        learning_rate=1e-3,
        policy_kwargs=dict(net_arch=[400, 300]),
    ),
    "MuJoCo": dict(
        learning_starts=10_000,
        gradient_steps=1,
        train_freq=1,
        learning_rate=1e-3,
        policy_kwargs=dict(net_arch=[400, 300]),
    ),
}
TD3_NOISE_STD = 0.1
# rl-baselines3-zoo hyperparams/ppo_lstm.yml, CartPoleNoVel-v1 (the issue quotes them): 8 envs, VecNormalize on the
# observations only, 100k steps (the linear schedules run over them).
ZOO_PPO_LSTM_STEPS = 100_000
ZOO_PPO_LSTM_ENVS = 8
ZOO_PPO_LSTM = dict(
    n_steps=32,
    batch_size=256,
    gae_lambda=0.8,
    gamma=0.98,
    n_epochs=20,
    ent_coef=0.0,
    learning_rate=lambda remaining: remaining * 1e-3,  # lin_0.001
    clip_range=lambda remaining: remaining * 0.2,  # lin_0.2
    policy_kwargs=dict(
        ortho_init=False,
        activation_fn=nn.ReLU,
        lstm_hidden_size=64,
        enable_critic_lstm=True,
        net_arch=dict(pi=[64], vf=[64]),
    ),
)


class MaskVelocity(gym.ObservationWrapper):
    """CartPole's observation with its velocities zeroed."""

    def observation(self, observation: np.ndarray) -> np.ndarray:
        observation = observation.copy()
        observation[list(VELOCITY_ENTRIES)] = 0.0
        return observation


gym.register(NO_VELOCITY, entry_point=lambda **kw: MaskVelocity(gym.make("CartPole-v1", **kw)))


def make_model(env_id: str, seed: int):
    """DQN with the zoo's CartPole settings for a Discrete task, TD3 with the zoo's settings for a Box one,
    RecurrentPPO with the zoo's settings for CartPoleNoVel-v1."""
    if env_id == NO_VELOCITY:
        return make_recurrent_ppo(env_id, seed)
    env = gym.make(env_id)
    if isinstance(env.action_space, gym.spaces.Discrete):
        return ZooScheduleDQN("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **ZOO_CARTPOLE)
    dims = env.action_space.shape[0]
    noise = NormalActionNoise(mean=np.zeros(dims), sigma=TD3_NOISE_STD * np.ones(dims))
    settings = ZOO_TD3.get(env_id, ZOO_TD3["MuJoCo"])
    return TD3("MlpPolicy", env, seed=seed, verbose=0, device="cpu", action_noise=noise, **settings)


def make_recurrent_ppo(env_id: str, seed: int):
    """sb3-contrib's RecurrentPPO as the zoo trains it on CartPoleNoVel-v1 (imported here: the other races do not
    need sb3-contrib)."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    envs = make_vec_env(env_id, n_envs=ZOO_PPO_LSTM_ENVS, seed=seed)
    envs = VecNormalize(envs, norm_obs=True, norm_reward=False)
    return RecurrentPPO("MlpLstmPolicy", envs, seed=seed, verbose=0, device="cpu", **ZOO_PPO_LSTM)


def greedy_mean_return(model, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of `episodes` greedy episodes played side by side (one env per episode). A recurrent model
    carries its state from step to step (reset where an episode starts); observations are normalised with the
    training run's statistics, frozen, where it trains on normalised ones."""
    envs = gym.make_vec(env_id, num_envs=episodes, vectorization_mode="sync")
    obs, _ = envs.reset(seed=seed)
    normalise = getattr(
        model.get_env(), "normalize_obs", None
    )  # VecNormalize's, without updating its statistics
    returns = np.zeros(episodes)
    done = np.zeros(episodes, dtype=bool)
    state, starts = None, np.ones(episodes, dtype=bool)
    while not done.all():
        seen = normalise(obs) if normalise is not None else obs
        actions, state = model.predict(seen, state=state, episode_start=starts, deterministic=True)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        returns += reward * ~done
        starts = terminated | truncated
        done |= starts  # autoreset restarts finished envs; their later rewards are ignored
    envs.close()
    return float(returns.mean())


class ZooScheduleDQN(DQN):
    """DQN whose epsilon follows the zoo's schedule (1.0 -> 0.04 over the first 16% of 50k steps) whatever the
    step cap: SB3 stretches the schedule over `total_timesteps`, and ours is a cap, not the zoo's run length."""

    def _on_step(self) -> None:
        super()._on_step()
        fraction = min(1.0, self.num_timesteps / (ZOO_CARTPOLE["exploration_fraction"] * ZOO_TIMESTEPS))
        self.exploration_rate = 1.0 + fraction * (ZOO_CARTPOLE["exploration_final_eps"] - 1.0)


class EvaluatingCallback(BaseCallback):
    """Evaluates every `--eval-every` steps and stops training at the target or at the training-time budget;
    the clock is the caller's `started`, less the time spent evaluating."""

    def __init__(self, args: argparse.Namespace, started: float) -> None:
        super().__init__()
        self.args = args
        self.started = started
        self.eval_seconds = 0.0
        self.evaluations: list[tuple[int, float, float]] = []
        self.solved_at: int | None = None

    def train_seconds(self) -> float:
        return time.perf_counter() - self.started - self.eval_seconds

    def evaluate(self) -> float:
        """One greedy evaluation, recorded as (env_steps, train_seconds, mean_return)."""
        train_seconds = self.train_seconds()
        started = time.perf_counter()
        mean = greedy_mean_return(
            self.model, self.args.env, self.args.eval_episodes, seed=10_000 + len(self.evaluations)
        )
        self.eval_seconds += time.perf_counter() - started
        self.evaluations.append((self.model.num_timesteps, round(train_seconds, 2), round(mean, 1)))
        return mean

    def _on_step(self) -> bool:
        # A vectorised model (RecurrentPPO's 8 envs) steps num_timesteps by its env count: evaluate on crossing.
        if self.num_timesteps // self.args.eval_every > len(self.evaluations):
            mean = self.evaluate()
            if self.args.target is not None and mean >= self.args.target:
                self.solved_at = self.num_timesteps
                return False
        budget = self.args.max_train_seconds
        return budget is None or self.train_seconds() < budget


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="greedy mean return that counts as solved and stops training (none: no target)",
    )
    parser.add_argument("--max-steps", type=int, default=200_000, help="give up after this many env steps")
    parser.add_argument(
        "--max-train-seconds",
        type=float,
        default=None,
        help="stop once this much training time (evaluations excluded) has passed (none: no time budget)",
    )
    parser.add_argument("--eval-every", type=int, default=2_000, help="env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the zoo's runs use 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    model = make_model(args.env, args.seed)
    callback = EvaluatingCallback(args, started)
    # RecurrentPPO's schedules run over the zoo's 100k steps (the step cap is a cap, not the run's length).
    steps = ZOO_PPO_LSTM_STEPS if args.env == NO_VELOCITY else args.max_steps
    model.learn(total_timesteps=min(steps, args.max_steps), callback=callback)
    train_seconds = callback.train_seconds()
    if not callback.evaluations or callback.evaluations[-1][0] != model.num_timesteps:
        callback.evaluate()  # the final policy, at the end of the budget
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "solved": callback.solved_at is not None,
                "env_steps": callback.solved_at if callback.solved_at is not None else model.num_timesteps,
                "train_seconds": round(train_seconds, 2),
                "wall_seconds": round(wall, 2),
                "final_return": callback.evaluations[-1][2],
                "evaluations": callback.evaluations,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
