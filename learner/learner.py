"""The Ape-X learner: samples prioritized batches across the shards, trains the algorithm's networks on them
(`apexrl.algorithms`: Ape-X DQN or DPG, chosen from the action space), writes |TD error| priorities back, and
publishes versioned weights for the actors. It never names an algorithm: everything algorithmic goes through the
`Learning` object of `apexrl.algorithms.base`.

Reads top to bottom: the data source, then `Learner.train_step` (one update) and `Learner.run` (the loop); the
metrics it exports are in `learner_metrics.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from apexrl.algorithms.checkpoint import CHECKPOINT_NAME, Checkpoint, load_checkpoint, save_checkpoint
from apexrl.algorithms.registry import Algorithm, for_spaces, with_defaults
from apexrl.common.errors import ApexError, ResourceExhaustedError, is_transient
from apexrl.common.settings import SettingsError
from apexrl.common.signature import ROW_VERSION_COLUMN
from apexrl.common.spaces import EnvSpaces
from apexrl.common.tensorboard_curves import TensorBoardCurves
from apexrl.learner.config import LearnerConfig
from apexrl.learner.feed import Batch, Feed, ThreadFeed
from apexrl.learner.learner_metrics import LearnerMetrics
from apexrl.learner.sampler_process import SamplerProcess, replay_sampler
from apexrl.learner.sharded_client import Shard
from apexrl.parameter_server.weights import VersionRefusedError

log = logging.getLogger("apexrl.learner")


# torch.optim.Optimizer methods that torch wraps in torch._disable_dynamo, whose first call imports torch._dynamo
# (1-1.4 s of CPU on a 2-core machine: half the learner's start-up, on the way to serving its first weights).
DYNAMO_WRAPPED_OPTIMIZER_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def skip_dynamo_import() -> None:
    """Let the optimizer's methods run without importing torch._dynamo. The learner never compiles (no
    torch.compile), so the "disabled for dynamo" version torch builds on their first call is the method itself;
    giving it that up front skips the import. Only while torch._dynamo is not loaded (once it is, nothing is left to
    save and torch's own wrapping stands), and only on torch's wrappers as they are (torch/_compile.py's `inner`,
    which looks for `__dynamo_disable` on the function it wraps); anything else is left alone."""
    import sys

    if "torch._dynamo" in sys.modules:
        return
    for name in DYNAMO_WRAPPED_OPTIMIZER_METHODS:
        wrapper = getattr(torch.optim.Optimizer, name, None)
        method = getattr(wrapper, "__wrapped__", None)
        code = getattr(wrapper, "__code__", None)
        if method is None or code is None or not code.co_filename.endswith("_compile.py"):
            continue
        if getattr(method, "__dynamo_disable", None) is None:
            method.__dynamo_disable = method


def resolve_device(name: str) -> torch.device:
    """ "auto" is CUDA when available, else the CPU; any other name is passed to torch. SettingsError (exit status 2)
    for a device this machine's torch cannot use (no GPU, a CPU-only build, an index past its GPUs), before any
    network is built on it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    try:  # "Torch not compiled with CUDA enabled" is an AssertionError, no GPU or a bad index a RuntimeError
        torch.zeros(1, device=device)
    except (RuntimeError, AssertionError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SettingsError(f"--device {name}: this machine's torch cannot use it ({reason})") from None
    return device


def make_sampler(config: LearnerConfig, shards: Sequence[Shard] | None = None) -> Feed:
    """The learner's feed (learner/feed.py): a child sampler process over `config.replay` (`sampler_process`, the
    default), or a thread of this process sampling a sharded replay client over `config.replay`'s addresses or
    over the given shard objects (in-process tables in a benchmark) with the same allocation and weights. Both
    carry batches of transitions and of sequence items (R2D2) alike."""
    if shards is None and config.sampler_process:
        return SamplerProcess(
            config, slots=config.prefetch_depth + 1, batches_per_call=config.sample_batches_per_call
        )
    return ThreadFeed(replay_sampler(config, shards), config)


class Learner:
    """Trains from `sampler` (a Feed: learner/feed.py, whichever process samples its batches) and
    publishes weights through `publish(weights, version) -> version`; it knows neither where the data comes from
    nor where the weights go, nor which algorithm it trains: `config.algorithm` (auto: by the action space of
    `spaces`) picks it, and the algorithm's defaults fill the settings left at None. Versions continue across
    restarts from the checkpoint, so actors never see a version go backwards while the service can take them;
    when it refuses one (VersionRefusedError), `service_version() -> version` says where to continue from. With
    `curves`, loss, mean Q and updates/s also go to TensorBoard (closed by close())."""

    def __init__(
        self,
        config: LearnerConfig,
        spaces: EnvSpaces,
        sampler: Feed,
        publish: Callable[[dict[str, np.ndarray], int], int],
        registry: CollectorRegistry | None = None,
        curves: TensorBoardCurves | None = None,
        *,
        service_version: Callable[[], int] | None = None,
    ) -> None:
        try:
            self.algorithm: Algorithm = for_spaces(config.algorithm, spaces, config.env)
        except ValueError as err:
            raise SettingsError(f"--algorithm: {err}") from None
        try:
            self.config = config = with_defaults(config, self.algorithm, "learner")
        except ValueError as err:
            raise SettingsError(str(err)) from None
        self.spaces = spaces
        self.device = resolve_device(config.device)
        if config.seed is not None:
            torch.manual_seed(config.seed)
        skip_dynamo_import()
        self.learning = self.algorithm.learning().make_learning(config, spaces, self.device)
        self.metrics = LearnerMetrics(registry if registry is not None else CollectorRegistry())
        self.sampler = sampler
        self._publish = publish
        self._service_version = service_version
        self.curves = curves
        self._pinned: dict[str, torch.Tensor] = {}  # CUDA: a pinned host buffer per batch column
        self.updates = 0
        self.weight_version = 0
        self._last_publish_warning = 0.0
        self._last_stats: dict[str, object] = {}
        self._resume()

    # ------------------------------------------------------------------------------------------- one update
    def beta(self) -> float:
        c = self.config
        fraction = min(1.0, self.updates / max(1, c.beta_anneal_updates))
        return c.beta_start + fraction * (c.beta_end - c.beta_start)

    def train_step(self, batch: Batch) -> float:
        """One update of the algorithm on a prioritized batch; new priorities go back to the shards asynchronously.
        Returns the update's loss."""
        col = {k: self._to_device(k, v) for k, v in batch.columns.items()}
        weights = self._to_device("importance_weights", batch.weights)
        result = self.learning.update(col, weights, self.updates + 1)
        self.sampler.update_priorities(
            batch, result.td_abs.cpu().numpy().astype(np.float64) + self.config.priority_epsilon
        )
        self.updates += 1
        if self.updates % self.config.publish_every == 0:
            self.publish_weights()
        self._last_stats = result.stats
        return result.loss.item()

    def _to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        """A batch column on the training device. On the CPU it is the array itself (a view of the sampler's
        shared slot, no copy). On CUDA it is copied into a pinned host buffer kept per column, then sent with a
        non-blocking copy; the buffer is reused next step, after this step has synchronised (loss.item())."""
        if self.device.type != "cuda":
            return torch.as_tensor(array)
        staging = self._pinned.get(name)
        if staging is None or tuple(staging.shape) != array.shape or staging.numpy().dtype != array.dtype:
            staging = torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype, pin_memory=True)
            self._pinned[name] = staging
        staging.numpy()[...] = array
        return staging.to(self.device, non_blocking=True)

    def publish_weights(self) -> int:
        """Publish the algorithm's acting weights as the next version; the version published (the previous one when a
        standalone parameter service cannot be reached or is busy: training goes on and the next publish tries
        again, so a restarted service gets weights as soon as it is back).

        A version the service refuses (not above its current one, or too far above it: another publisher went
        ahead, or the service restarted far below this learner's checkpoint) is not a reason to stop training: the
        learner reads the service's version and publishes above it."""
        weights = self.learning.acting_weights()
        try:
            try:
                self.weight_version = self._publish(weights, self.weight_version + 1)
            except VersionRefusedError as refused:
                if self._service_version is None:
                    raise  # counted below as a failed publish, like any other transient failure
                self.weight_version = self._resync(weights, refused)
        except ApexError as err:
            if not (is_transient(err) or isinstance(err, ResourceExhaustedError)):
                raise
            self.metrics.publish_failures.inc()
            if time.monotonic() - self._last_publish_warning > 10:
                log.warning(
                    "publishing weights version %d failed (training goes on, the next publish retries): %s",
                    self.weight_version + 1,
                    err,
                )
                self._last_publish_warning = time.monotonic()
            return self.weight_version
        self.metrics.weight_version.set(self.weight_version)
        return self.weight_version

    def _resync(self, weights: dict[str, np.ndarray], refused: VersionRefusedError) -> int:
        """Publish `weights` right above the service's current version; the version published."""
        current = self._service_version()
        log.warning(
            "the parameter service refused weights version %d (%s); it holds version %d: publishing %d and "
            "counting on from there",
            self.weight_version + 1,
            refused,
            current,
            current + 1,
        )
        self.metrics.version_resyncs.inc()
        return self._publish(weights, current + 1)

    # ------------------------------------------------------------------------------------------------- loop
    def run(self, stop: threading.Event, progress_every: float = 10.0) -> None:
        """Train until `stop` is set or max_updates is reached; checkpoint periodically and at the end."""
        c = self.config
        self.publish_weights()  # actors can start acting before the first update
        feed = self.sampler.start(self.beta)
        self.metrics.prefetch_queue.set_function(lambda: feed.depth)
        self.metrics.rows_rejected.set_function(lambda: feed.rows_rejected)
        self.metrics.updates_outstanding.set_function(lambda: self.sampler.updates_outstanding)
        log.info(
            "learner on %s: waiting for %d rows in replay (%s)",
            self.device,
            c.min_replay_size,
            ", ".join(c.replay),
        )
        import torch._dynamo  # noqa: F401 (optimizer.step() imports it, ~1 s: while replay fills, not at update 1)

        last_log, last_updates = time.monotonic(), self.updates
        try:
            while not stop.is_set() and (c.max_updates is None or self.updates < c.max_updates):
                wait_start = time.perf_counter()
                batch = feed.get(timeout=0.5)
                if batch is None:
                    continue
                self.metrics.sample_wait.observe(time.perf_counter() - wait_start)
                if ROW_VERSION_COLUMN in batch.columns:
                    self.metrics.row_staleness.observe_many(
                        self.weight_version - batch.columns[ROW_VERSION_COLUMN]
                    )
                with self.metrics.step_time.time():
                    loss = self.train_step(batch)
                self.metrics.updates.inc()
                self.metrics.rows_trained.inc(len(batch.weights))
                if self.updates % 20 == 0:
                    self._record(loss, batch)
                if c.checkpoint_dir and self.updates % c.checkpoint_every == 0:
                    self.save()
                now = time.monotonic()
                if now - last_log >= progress_every:
                    rate = (self.updates - last_updates) / (now - last_log)
                    self.metrics.updates_per_second.set(rate)
                    if self.curves is not None:
                        self.curves.add(self.updates, updates_per_second=rate)
                    log.info(
                        "updates %d (%.1f/s), loss %.4f, beta %.2f, weights v%d, replay %d rows, "
                        "stale priority updates %d",
                        self.updates,
                        rate,
                        loss,
                        self.beta(),
                        self.weight_version,
                        batch.fleet_size,
                        self.sampler.updates_stale,
                    )
                    last_log, last_updates = now, self.updates
        finally:
            # Checkpoint first: what follows waits on the network, and a supervisor's grace period is short.
            if c.checkpoint_dir:
                log.info("final checkpoint: %s", self.save())
            feed.stop(wait=False)  # its Sample call may be held back by a rate limiter; close() cancels it
            try:
                self.sampler.flush_updates(timeout=2)
            except TimeoutError:
                log.warning("some priority updates were still in flight at exit")

    def _record(self, loss: float, batch: Batch) -> None:
        """Metrics and curves of the last update and of the networks on its batch."""
        stats = self.learning.batch_stats({"obs": torch.as_tensor(batch.columns["obs"], device=self.device)})
        scalars = {"loss": loss, "mean_q": stats["mean_q"]}
        self.metrics.loss.set(loss)
        self.metrics.mean_q.set(stats["mean_q"])
        if "policy_loss" in self._last_stats:
            scalars["policy_loss"] = float(self._last_stats["policy_loss"])
            self.metrics.policy_loss.set(scalars["policy_loss"])
        for gauge, key in (
            (self.metrics.action_mean, "action_mean"),
            (self.metrics.action_std, "action_std"),
        ):
            for dimension, value in enumerate(stats.get(key, ())):
                gauge.labels(str(dimension)).set(value)
        self.metrics.fleet_size.set(batch.fleet_size)
        self.metrics.stale.set(self.sampler.updates_stale)
        self.metrics.updates_dropped.set(self.sampler.updates_dropped)
        if self.curves is not None:
            self.curves.add(self.updates, **scalars)

    # ------------------------------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        return save_checkpoint(
            self.config.checkpoint_dir / CHECKPOINT_NAME,
            Checkpoint(
                env_id=self.config.env,
                env_module=self.config.env_module,
                env_kwargs=self.config.env_kwargs,
                algorithm=self.algorithm.name,
                spaces=self.spaces,
                architecture=self.learning.architecture,
                state=self.learning.state_dict(),
                acting_weights=self.learning.acting_weights(),
                updates=self.updates,
                weight_version=self.weight_version,
            ),
        )

    def _resume(self) -> None:
        """Continue from checkpoint_dir/checkpoint.pt when it exists (same network shape required)."""
        if not self.config.checkpoint_dir:
            return
        path = self.config.checkpoint_dir / CHECKPOINT_NAME
        if not path.exists():
            return
        try:
            ckpt = load_checkpoint(path, map_location=self.device)
        except ValueError as err:
            raise SettingsError(f"--run-dir: {err}") from None
        if ckpt.algorithm != self.algorithm.name:
            raise SettingsError(
                f"checkpoint {path} was trained by algorithm {ckpt.algorithm}; this learner runs "
                f"{self.algorithm.name}"
            )
        if ckpt.architecture != self.learning.architecture:
            differ = sorted(
                k
                for k in {*ckpt.architecture, *self.learning.architecture}
                if ckpt.architecture.get(k) != self.learning.architecture.get(k)
            )
            raise SettingsError(
                f"checkpoint {path} has another network: "
                + "; ".join(
                    f"{k} {ckpt.architecture.get(k)} there, {self.learning.architecture.get(k)} in the configuration"
                    for k in differ
                )
            )
        self.learning.load_state_dict(ckpt.state)
        self.updates = ckpt.updates
        self.metrics.updates.inc(ckpt.updates)  # the fleet's progress line and final JSON count every update
        self.weight_version = ckpt.weight_version
        log.info("resumed from %s at update %d", path, self.updates)

    def close(self) -> None:
        """Close the sampler (cancelling a Sample still in flight) and the TensorBoard curves."""
        self.sampler.close()
        if self.curves is not None:
            self.curves.close()
