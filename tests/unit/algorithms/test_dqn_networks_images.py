"""Networks for images (learner/networks.py): chosen from the observation space, image layouts, pixel scaling
inside the network, and the named-tensor weight format for convolutional networks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.algorithms.dqn.networks import ConvDuelingQNetwork, DuelingQNetwork, build_network
from apexrl.algorithms.torso_specs import resolve_network
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.environments import CHW, HW, HWC, VECTOR, EnvSpaces, image_layout
from apexrl.learner.feed import ThreadFeed
from tests.support.numpy_weights import load_numpy_state_dict

ATARI = EnvSpaces((4, 84, 84), "uint8", 6)  # FrameStackObservation(AtariPreprocessing(...), 4)
MINATAR = EnvSpaces((10, 10, 4), "bool", 3)  # MinAtar/Breakout-v1
CARTPOLE = EnvSpaces.vector(4, 2)


@pytest.mark.parametrize(
    ("shape", "layout"),
    [
        ((4,), VECTOR),
        ((84, 84), HW),
        ((4, 84, 84), CHW),
        ((3, 64, 64), CHW),
        ((10, 10, 4), HWC),
        ((10, 10, 10), HWC),
        ((210, 160, 3), HWC),
        ((84, 84, 4), HWC),
    ],
)
def test_image_layout_reads_the_channel_axis_from_the_shape(shape, layout):
    assert image_layout(shape) == layout


def test_image_shape_puts_channels_first_and_uint8_pixels_are_scaled():
    assert ATARI.image_shape == (4, 84, 84) and ATARI.input_scale == pytest.approx(1 / 255)
    assert MINATAR.image_shape == (4, 10, 10) and MINATAR.input_scale == 1.0
    assert EnvSpaces((84, 84), "uint8", 2).image_shape == (1, 84, 84)
    with pytest.raises(ValueError, match="not images"):
        _ = CARTPOLE.image_shape


def test_auto_picks_the_network_from_the_observation_space():
    assert resolve_network("auto", CARTPOLE) == "mlp"
    assert resolve_network("auto", ATARI) == "nature"
    assert resolve_network("auto", MINATAR) == "minatar"
    assert resolve_network("auto", EnvSpaces((36, 36, 3), "uint8", 2)) == "nature"  # Nature's smallest input
    assert resolve_network("auto", EnvSpaces((35, 35, 3), "uint8", 2)) == "minatar"
    assert resolve_network("mlp", MINATAR) == "mlp"  # images may be flattened on request
    assert resolve_network("minatar", ATARI) == "minatar"


def test_a_network_that_cannot_read_the_observations_is_refused():
    with pytest.raises(ValueError, match="nature cannot read images of 10x10"):
        resolve_network("nature", MINATAR)
    with pytest.raises(ValueError, match="minatar needs image observations"):
        resolve_network("minatar", CARTPOLE)
    with pytest.raises(ValueError, match="must be one of auto, mlp, nature, minatar"):
        resolve_network("resnet", ATARI)


def test_nature_network_shapes_names_and_default_sizes():
    torch.manual_seed(0)
    net = build_network("auto", ATARI)
    assert isinstance(net, ConvDuelingQNetwork)
    shapes = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    assert shapes == {
        "conv.0.weight": (32, 4, 8, 8),
        "conv.0.bias": (32,),
        "conv.2.weight": (64, 32, 4, 4),
        "conv.2.bias": (64,),
        "conv.4.weight": (64, 64, 3, 3),
        "conv.4.bias": (64,),
        "conv_strides": (3,),
        "torso.0.weight": (512, 64 * 7 * 7),
        "torso.0.bias": (512,),  # 84 -> 20 -> 9 -> 7
        "value.weight": (1, 512),
        "value.bias": (1,),
        "advantage.weight": (6, 512),
        "advantage.bias": (6,),
    }
    assert net.conv_strides.tolist() == [4, 2, 1]
    assert not any(name == "conv_strides" for name, _ in net.named_parameters())  # never trained
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    assert net(obs).shape == (5, 6)


def test_minatar_network_shapes_and_sizes():
    net = build_network("auto", MINATAR)
    shapes = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    assert shapes["conv.0.weight"] == (16, 4, 3, 3) and shapes["torso.0.weight"] == (128, 16 * 8 * 8)
    assert net.conv_strides.tolist() == [1]
    assert net(torch.zeros(2, 10, 10, 4, dtype=torch.bool)).shape == (2, 3)
    wide = build_network("minatar", MINATAR, hidden_sizes=(64, 32))
    assert tuple(wide.state_dict()["torso.2.weight"].shape) == (32, 64)
    assert isinstance(build_network("auto", CARTPOLE), DuelingQNetwork)
    assert tuple(build_network("auto", CARTPOLE).state_dict()["torso.2.weight"].shape) == (256, 256)


def test_uint8_pixels_are_scaled_by_1_over_255_inside_the_network():
    torch.manual_seed(1)
    pixels = build_network("nature", ATARI)
    floats = build_network("nature", EnvSpaces((4, 84, 84), "float32", 6))  # no scaling for float inputs
    floats.load_state_dict(pixels.state_dict())
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(pixels(obs), floats(obs.float() / 255.0))
    # The MLP flattens and scales images the same way.
    mlp_pixels = build_network("mlp", ATARI, hidden_sizes=(8,))
    mlp_floats = DuelingQNetwork(4 * 84 * 84, 6, (8,))
    mlp_floats.load_state_dict(mlp_pixels.state_dict())
    torch.testing.assert_close(mlp_pixels(obs), mlp_floats(obs.reshape(3, -1).float() / 255.0))


def test_channels_last_images_are_read_as_the_same_images_channels_first():
    torch.manual_seed(2)
    hwc = build_network("minatar", MINATAR)
    chw = build_network("minatar", EnvSpaces((4, 10, 10), "bool", 3))
    chw.load_state_dict(hwc.state_dict())  # the same weights: only the layout differs
    obs = torch.rand(6, 10, 10, 4) < 0.2
    torch.testing.assert_close(hwc(obs), chw(obs.permute(0, 3, 1, 2)))
    # Moving the channels for real changes the answer: the layout is not ignored.
    assert not torch.allclose(hwc(obs), chw(obs.transpose(1, 3)))
    # Single-channel images ([H, W]) get their channel axis.
    hw = build_network("minatar", EnvSpaces((10, 10), "uint8", 2))
    one = build_network("minatar", EnvSpaces((1, 10, 10), "uint8", 2))
    one.load_state_dict(hw.state_dict())
    frames = torch.randint(0, 256, (2, 10, 10), dtype=torch.uint8)
    torch.testing.assert_close(hw(frames), one(frames[:, None]))


def test_convolutional_weights_round_trip_as_named_numpy_arrays():
    torch.manual_seed(3)
    source, dest = build_network("nature", ATARI), build_network("nature", ATARI)
    weights = state_dict_to_numpy(source)
    assert weights["conv_strides"].dtype == np.int64 and weights["conv_strides"].tolist() == [4, 2, 1]
    assert all(w.dtype == np.float32 for name, w in weights.items() if name != "conv_strides")
    obs = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert not torch.equal(source(obs), dest(obs))
    load_numpy_state_dict(dest, weights)
    torch.testing.assert_close(dest(obs), source(obs), rtol=0, atol=0)
    with pytest.raises(
        ValueError, match=r"conv\.0\.weight: shape \(16, 4, 3, 3\) != expected \(32, 4, 8, 8\)"
    ):
        load_numpy_state_dict(dest, state_dict_to_numpy(build_network("minatar", ATARI)))


def minatar_batch(rows: int, seed: int = 0):
    from tests.unit.learner.fakes import make_batch

    batch = make_batch(range(rows), obs_dim=4, num_actions=3)
    rng = np.random.default_rng(seed)
    batch.columns["obs"] = rng.random((rows, 10, 10, 4)) < 0.1  # bool planes, as MinAtar's replay rows
    batch.columns["next_obs"] = rng.random((rows, 10, 10, 4)) < 0.1
    return batch


def test_the_learner_trains_publishes_and_checkpoints_a_network_for_images(tmp_path):
    from apexrl.algorithms.checkpoint import load_checkpoint
    from apexrl.common.settings import SettingsError
    from apexrl.learner.learner import Learner
    from tests.unit.learner.fakes import FakeSampler, Publisher, config

    cfg = config(tmp_path, hidden_sizes=None, network="auto")
    publish = Publisher()
    learner = Learner(cfg, MINATAR, ThreadFeed(FakeSampler(), cfg), publish)
    assert (learner.learning.network, learner.learning.hidden_sizes) == ("minatar", (128,))
    online = learner.learning.online
    before = {k: v.clone() for k, v in online.state_dict().items()}
    for _ in range(cfg.publish_every):
        assert np.isfinite(learner.train_step(minatar_batch(8)))
    assert not torch.equal(before["conv.0.weight"], online.state_dict()["conv.0.weight"])
    version, weights = publish.published[-1]
    assert weights["conv.0.weight"].shape == (16, 4, 3, 3) and weights["conv_strides"].tolist() == [1]
    saved = load_checkpoint(learner.save())
    assert (saved.architecture["network"], saved.architecture["hidden_sizes"], saved.spaces) == (
        "minatar",
        [128],
        MINATAR,
    )
    # The same run directory with another torso is refused, naming both.
    with pytest.raises(
        SettingsError, match=r"has another network: network minatar there, mlp in the configuration"
    ):
        cfg = config(tmp_path, hidden_sizes=(128,), network="mlp")
        Learner(cfg, MINATAR, ThreadFeed(FakeSampler(), cfg), Publisher())


def test_a_checkpoint_of_a_convolutional_network_plays_with_apexrl_evaluate(tmp_path, capsys):
    pytest.importorskip("minatar")
    from apexrl.algorithms.checkpoint import Checkpoint, save_checkpoint
    from apexrl.launcher import cli

    torch.manual_seed(0)
    net = build_network("auto", MINATAR)
    save_checkpoint(
        tmp_path / "checkpoint.pt",
        Checkpoint(
            env_id="MinAtar/Breakout-v1",
            algorithm="dqn",
            spaces=MINATAR,
            architecture={"network": "minatar"},
            state={},
            acting_weights=state_dict_to_numpy(net),
            updates=0,
            weight_version=1,
        ),
    )
    assert cli.main(["evaluate", str(tmp_path), "--episodes", "2", "--seed", "0"]) == 0
    assert '"episodes": 2' in capsys.readouterr().out
