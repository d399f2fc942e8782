"""`apexrl evaluate` builds the environment as training built it (its plugin module, its constructor arguments,
no render_mode it never asked for), records videos with Gymnasium's RecordVideo, and turns a missing pygame or
moviepy into one line naming the extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apexrl.algorithms.checkpoint import save_checkpoint
from apexrl.common.env_settings import EnvChoice, EnvKwargs
from apexrl.common.environments import env_spaces
from apexrl.launcher import cli
from tests.support.checkpoints import fresh_checkpoint

ROOT = Path(__file__).resolve().parents[3]


def run_dir(tmp_path: Path, choice: EnvChoice) -> Path:
    folder = tmp_path / choice.run_name()
    save_checkpoint(
        folder / "checkpoints" / "checkpoint.pt",
        fresh_checkpoint(choice.id, env_spaces(choice), env_module=choice.modules, env_kwargs=choice.kwargs),
    )
    return folder


def without(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment in which `import MODULE` fails, as on a machine without the package."""
    shadow = tmp_path / f"no-{module}"
    (shadow / module).mkdir(parents=True)
    (shadow / module / "__init__.py").write_text(f"raise ImportError('No module named {module}')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(ROOT)]), "SDL_AUDIODRIVER": "dummy"}


def evaluate(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "evaluate", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_custom_environment_is_played_with_its_module_and_arguments(tmp_path, capsys):
    """Line-v0 takes no render_mode (the old evaluate passed render_mode=None and crashed) and its `length` sets the
    observation size: the checkpoint's own arguments must reach it, or the network would not fit."""
    choice = EnvChoice("tests.support.custom_envs:Line-v0", kwargs=EnvKwargs({"length": 6}))
    folder = run_dir(tmp_path, choice)
    assert cli.main(["evaluate", str(folder), "--episodes", "2", "--seed", "0", "--trust-env-modules"]) == 0
    out = capsys.readouterr().out
    assert 'on tests.support.custom_envs:Line-v0 {"length": 6} for 2 greedy episodes' in out
    assert json.loads(out.strip().splitlines()[-1])["episodes"] == 2
    assert (
        cli.main(
            [
                "evaluate",
                str(folder),
                "--episodes",
                "1",
                "--env-kwargs",
                '{"length": 7}',
                "--trust-env-modules",
            ]
        )
        == 2
    )
    assert "has observations of size 7" in capsys.readouterr().err


def test_render_without_pygame_is_one_line_naming_the_render_extra(tmp_path):
    folder = run_dir(tmp_path, EnvChoice("CartPole-v1"))
    done = evaluate(str(folder), "--episodes", "1", "--render", env=without(tmp_path, "pygame"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "apexrl evaluate: error: rendering needs pygame: pip install 'apexrl[render]'"
    ), done.stderr


def test_record_video_without_moviepy_is_one_line_naming_the_video_extra(tmp_path):
    folder = run_dir(tmp_path, EnvChoice("CartPole-v1"))
    done = evaluate(
        str(folder),
        "--episodes",
        "1",
        "--record-video",
        str(tmp_path / "videos"),
        env=without(tmp_path, "moviepy"),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "apexrl evaluate: error: --record-video needs moviepy: pip install 'apexrl[video]'"
    ), done.stderr


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_record_video_writes_one_mp4_per_episode(tmp_path, capsys, env):
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    folder = run_dir(tmp_path, EnvChoice(env))
    videos = tmp_path / "videos"
    assert (
        cli.main(["evaluate", str(folder), "--episodes", "2", "--seed", "0", "--record-video", str(videos)])
        == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    files = sorted(videos.glob("*.mp4"))
    assert [str(f) for f in files] == summary["videos"] and len(files) == 2
    for file in files:
        head = file.read_bytes()[:12]
        assert head[4:8] == b"ftyp" and file.stat().st_size > 1000  # an MP4 container with frames in it


def test_render_and_record_video_exclude_each_other(tmp_path, capsys):
    assert cli.main(["evaluate", str(tmp_path), "--render", "--record-video", str(tmp_path / "v")]) == 2
    assert "render and record_video exclude each other" in capsys.readouterr().err


def test_a_run_directory_runs_no_code_it_names_unless_the_user_says_so(tmp_path):
    """A downloaded run directory whose checkpoint names an environment module that lies beside it: evaluating it
    there refuses in one line naming the module, and runs nothing; trusted, the module is still never looked for
    in the working directory (issue 31, item 3)."""
    folder = tmp_path / "downloaded"
    save_checkpoint(
        folder / "checkpoints" / "checkpoint.pt",
        fresh_checkpoint("CartPole-v1", env_spaces("CartPole-v1"), env_module=("evil",)),
    )
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    plain = {**os.environ, "PYTHONPATH": str(ROOT)}
    for extra in ([], ["--trust-env-modules"]):
        done = subprocess.run(
            [sys.executable, "-m", "apexrl.launcher", "evaluate", ".", "--episodes", "1", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=folder,
            env=plain,
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "evil" in done.stderr and not marker.exists(), done.stderr
    assert "--trust-env-modules" in done.stderr or "cannot import environment module 'evil'" in done.stderr
