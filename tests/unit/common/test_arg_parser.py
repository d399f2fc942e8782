"""One-line argparse errors (common/arg_parser.py): every error of a parser and its subcommands is `PROG: error:
MESSAGE` with exit status 2, in plain words, with the nearest flag, choice or command suggested; --help unchanged."""

from __future__ import annotations

import argparse

import pytest

from apexrl.common.arg_parser import ArgParser


def build(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    top = cls(prog="tool", description="a tool")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run it", description="runs it")
    run.add_argument("--max-seconds", type=float, default=1.0, help="time budget")
    run.add_argument("--mode", choices=("fast", "slow"), default="fast", help="how")
    run.add_argument("--flag", action=argparse.BooleanOptionalAction, default=False, help="a switch")
    group = run.add_argument_group("more")
    group.add_argument("--num-actors", type=int, default=1, help="actors")
    sub.add_parser("stop", help="stop it")
    return top


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["run", "--max-secs", "3"],
            "tool run: error: unknown flag --max-secs (did you mean --max-seconds?)",
        ),
        (["run", "--max-secs=3"], "tool run: error: unknown flag --max-secs (did you mean --max-seconds?)"),
        (
            ["run", "--num-actor", "2", "--bogus"],  # no abbreviations: a prefix is a typo like any other
            "tool run: error: unknown flag --num-actor (did you mean --num-actors?); unknown flag --bogus",
        ),
        (["run", "--max-seconds", "x"], "tool run: error: --max-seconds: expected a number, got 'x'"),
        (["run", "--num-actors", "two"], "tool run: error: --num-actors: expected an integer, got 'two'"),
        (["run", "--max-seconds"], "tool run: error: --max-seconds: expected a value"),
        (
            ["run", "--mode", "fats"],
            "tool run: error: --mode: expected one of fast, slow, got 'fats' (did you mean fast?)",
        ),
        (
            ["run", "--mode", "SLOW"],
            "tool run: error: --mode: expected one of fast, slow, got 'SLOW' (did you mean slow?)",
        ),
        (["run", "--flag=yes"], "tool run: error: --flag: takes no value, got 'yes'"),
        (["run", "extra"], "tool run: error: unexpected argument 'extra'"),
        (["rnu"], "tool: error: unknown command 'rnu' (did you mean run?)"),
        (["zzz"], "tool: error: unknown command 'zzz' (one of: run, stop)"),
        ([], "tool: error: the following arguments are required: COMMAND"),
    ],
)
def test_every_error_is_one_line_with_exit_status_2(argv, line, capsys):
    with pytest.raises(SystemExit) as exited:
        build(ArgParser).parse_args(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == line + "\n" and captured.out == ""


def test_good_arguments_parse_and_no_flag_is_taken_by_its_prefix(capsys):
    args = build(ArgParser).parse_args(["run", "--max-seconds", "3", "--num-actors=2", "--flag"])
    assert (args.command, args.max_seconds, args.num_actors, args.flag) == ("run", 3.0, 2, True)
    with pytest.raises(SystemExit) as exited:  # argparse's default would read it as --max-seconds
        build(ArgParser).parse_args(["run", "--max-sec", "3"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr().err == "tool run: error: unknown flag --max-sec (did you mean --max-seconds?)\n"
    )


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_help_is_argparses_own(argv, capsys):
    outputs = []
    for cls in (argparse.ArgumentParser, ArgParser):
        with pytest.raises(SystemExit) as exited:
            build(cls).parse_args(argv)
        assert exited.value.code == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and "usage: tool" in outputs[0]
