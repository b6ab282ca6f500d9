import pytest

from sparse_compile import DEFAULT_PRESET, PRESETS, SparsityConfig
from sparse_compile.config import BackendOptions, parse_activation_pattern


@pytest.mark.parametrize(
    "text, expected", [("2:4", (1, 2, 4)), ("64:2:8", (64, 2, 8)), ("128:4:16", (128, 4, 16)), ("1:1:4", (1, 1, 4))]
)
def test_parse_activation_pattern(text, expected):
    assert parse_activation_pattern(text) == expected


@pytest.mark.parametrize("bad", ["", "2", "2:3", "0:2:8", "64:3:8", "64:2:6", "64:2:2", "64:4:4", "a:b:c", "1:2:4:8"])
def test_bad_activation_pattern_names_field_and_value(bad):
    with pytest.raises(ValueError, match=r"SparsityConfig.activations=.*expected"):
        SparsityConfig(activations=bad)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"weights": "4:8"}, "weights"),
        ({"weights": "2:4", "weight_grad": "sparse"}, "weight_grad"),
        ({"weights": "2:4", "kernels": "cuda"}, "kernels"),
        ({"weights": "2:4", "min_hidden": -1}, "min_hidden"),
        ({"weights": "2:4", "masked_decay": -0.1}, "masked_decay"),
        ({"activations": "2:4", "masked_decay": 1e-4}, "masked_decay"),
        ({}, "nothing sparse"),
        ({"activations": "2:4", "weight_copies": "drop"}, r"weight_copies='drop'.*'keep' or 'recompute'"),
        ({"weights": "2:4", "weight_copies": "recompute"}, r"weight_copies='recompute' needs weights=None"),
    ],
)
def test_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SparsityConfig(**kwargs)


def test_presets():
    assert PRESETS["venom"] == SparsityConfig(weights="2:4", activations="64:2:8")
    assert PRESETS[DEFAULT_PRESET] == SparsityConfig(
        activations="128:4:16", chunk=128, causal=True, score_rows=16, weight_copies="recompute"
    )
    assert PRESETS["chunked-half"] == SparsityConfig(activations="128:4:8", chunk=64, causal=True)
    assert SparsityConfig.preset("activation24").activation_pattern == (1, 2, 4)
    assert SparsityConfig.preset("weight24").activations is None
    with pytest.raises(ValueError, match="preset='nope'"):
        SparsityConfig.preset("nope")


def test_options_parsing():
    assert BackendOptions.parse(None).config == PRESETS[DEFAULT_PRESET] == PRESETS["chunked"]
    assert BackendOptions.parse({"dump_dir": "/tmp/x"}).config == PRESETS["chunked"]
    # options without a pattern apply on top of the default preset
    forced = BackendOptions.parse({"small_ffn": "sparse", "chunk": 32}).config
    assert (forced.activations, forced.chunk, forced.causal, forced.small_ffn) == ("128:4:16", 32, True, "sparse")
    only_act = BackendOptions.parse({"activations": "128:2:8"}).config
    assert only_act.weights is None and only_act.activation_pattern == (128, 2, 8)
    over = BackendOptions.parse({"preset": "venom", "activations": "2:4"}).config
    assert over.weights == "2:4" and over.activations == "2:4"
    # the default's score_rows holds for its causal chunked pattern only: keys on top that leave a
    # pattern it cannot score drop it unless they name it (then SparsityConfig's error)
    for on_top in ({"causal": False}, {"chunk": 1, "causal": False}, {"preset": "chunked", "activations": "8:4:16"}):
        assert BackendOptions.parse(on_top).config.score_rows is None
    assert BackendOptions.parse({"chunk": 64}).config.score_rows == 16
    assert BackendOptions.parse({"score_rows": 32}).config.score_rows == 32
    assert BackendOptions.parse({"activations": "128:4:16", "chunk": 128, "causal": True}).config.score_rows is None
    # the default's weight_copies="recompute" holds without 2:4 weights only (2:4 copies are masked)
    assert BackendOptions.parse({"weights": "2:4", "preset": "chunked"}).config.weight_copies == "keep"
    assert BackendOptions.parse({"causal": False}).config.weight_copies == "recompute"
    with pytest.raises(ValueError, match="weight_copies='recompute' needs weights=None"):
        BackendOptions.parse({"preset": "chunked", "weights": "2:4", "weight_copies": "recompute"})
    with pytest.raises(ValueError, match="score_rows=16.*causal=False"):
        BackendOptions.parse({"causal": False, "score_rows": 16})
    assert BackendOptions.parse({"mode": "max-autotune-no-cudagraphs"}).mode == "max-autotune-no-cudagraphs"
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['activation'\]"):
        BackendOptions.parse({"activation": "2:4"})
    with pytest.raises(ValueError, match="inductor"):
        BackendOptions.parse({"inductor": 3})
    with pytest.raises(ValueError, match="not both"):
        BackendOptions.parse({"mode": "default"}, mode="max-autotune")


def test_dump_dir_from_env(monkeypatch):
    monkeypatch.setenv("SPARSE_COMPILE_DUMP_DIR", "/tmp/dumps")
    assert BackendOptions.parse({}).dump_dir == "/tmp/dumps"
    assert BackendOptions.parse({"dump_dir": "/tmp/other"}).dump_dir == "/tmp/other"


def test_options_from_text():
    from sparse_compile.config import options_from_text

    assert options_from_text("venom") == {"preset": "venom"}
    assert options_from_text(' {"activations": "2:4"}') == {"activations": "2:4"}
    with pytest.raises(ValueError, match="not valid JSON"):
        options_from_text("{bad")
    assert options_from_text("[1]") == {"preset": "[1]"}  # not JSON: a preset name, rejected later
