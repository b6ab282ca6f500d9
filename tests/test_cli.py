import subprocess
import sys

import pytest

from sparse_compile.cli import main


def test_explain_prints_the_report(capsys):
    assert (
        main(
            [
                "explain",
                "bench.model:tiny",
                "--input-shape",
                "2,128",
                "--input-dtype",
                "int64",
                "--int-high",
                "256",
                "--options",
                '{"activations": "2:4"}',
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "4 sparse FFN site(s), 0 dense" in out and "blocks.0.mlp" in out and "A2:4" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["explain", "bench.model:tiny", "--input-shape", "2,x"], "comma-separated ints"),
        (
            ["explain", "bench.model:tiny", "--input-shape", "2,128", "--options", '{"activations": "3:4"}'],
            "SparsityConfig.activations='3:4'",
        ),
        (["explain", "nomodule_here:f", "--input-shape", "2"], "cannot load"),
    ],
)
def test_bad_arguments_exit_non_zero_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    # argparse prints its message and exits 2; SystemExit(message) is printed by the interpreter (exit 1)
    assert e.value.code not in (0, None) and message in capsys.readouterr().err + str(e.value.code)


def test_bad_argument_exits_non_zero_from_the_command_line():
    argv = ["explain", "bench.model:tiny", "--input-shape", "2,x"]
    out = subprocess.run([sys.executable, "-m", "sparse_compile.cli", *argv], capture_output=True, text=True)
    assert out.returncode != 0 and "comma-separated ints" in out.stderr
