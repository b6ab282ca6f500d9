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


@pytest.mark.parametrize(
    "value, problem",
    [
        ("128:5:16", "N=5 must be 1, 2 or 4"),
        ("128:4:10", "M=10 must be a multiple of 4 larger than N=4"),
        ("64:4:4", "M=4 must be a multiple of 4 larger than N=4"),
        ("2:3", "M=3 must be a multiple of 4 larger than N=2"),
        ("0:2:8", "V=0 must be >= 1"),
        ("64:x:8", "N='x' is not an integer"),
        ("2-4", "1 part(s) separated by ':', not 2 (N:M, e.g. '2:4') or 3 (V:N:M, e.g. '64:2:8')"),
        ("1:2:4:8", "4 part(s) separated by ':', not 2 (N:M, e.g. '2:4') or 3 (V:N:M, e.g. '64:2:8')"),
        (128, "not a string (int)"),
    ],
)
def test_a_bad_pattern_names_the_part_that_is_wrong(value, problem):
    rule = "expected None, '2:4' or 'V:N:M' (e.g. '64:2:8') with V >= 1, N in {1, 2, 4} and M a multiple of 4 "
    rule += "larger than N"
    with pytest.raises(ValueError) as info:
        SparsityConfig(activations=value)
    assert str(info.value) == f"SparsityConfig.activations={value!r}: {problem}; {rule}"


@pytest.mark.parametrize(
    "value, problem",
    [
        ("tokens:64:3:8", "N=3 must be 1, 2 or 4"),
        ("tokens:64:2:6", "M=6 must be a multiple of 4 larger than N=2"),
        ("tokens:2:4", "2 part(s) separated by ':', not 3 (V:N:M, e.g. '64:2:8')"),
        ("sparse", "not 'dense' or 'tokens:...'"),
        (8, "not a string (int)"),
    ],
)
def test_a_bad_weight_grad_names_the_part_that_is_wrong(value, problem):
    with pytest.raises(ValueError) as info:
        SparsityConfig(weights="2:4", weight_grad=value)
    rule = "expected 'dense' or 'tokens:V:N:M' (V:N:M along tokens, e.g. 'tokens:64:2:8')"
    assert str(info.value) == f"SparsityConfig.weight_grad={value!r}: {problem}; {rule}"


@pytest.mark.parametrize("options", ["fast", ["preset", "venom"], 3])
def test_options_that_are_not_a_mapping_raise_a_type_error_naming_the_type(options):
    with pytest.raises(TypeError) as info:
        BackendOptions.parse(options)
    head = f"sparse_compile: options={options!r} is a {type(options).__name__}, not a mapping; expected a dict"
    assert str(info.value).startswith(head)
    assert ("options={'preset': 'fast'}" in str(info.value)) == (options == "fast")  # a string may be a preset's name


def test_bad_options_lead_with_the_project_and_name_the_field():
    with pytest.raises(ValueError) as info:
        BackendOptions.parse({"activations": "128:5:16"})
    head = "sparse_compile: bad options for backend='sparse': "
    assert str(info.value).startswith(f"{head}SparsityConfig.activations='128:5:16': N=5 must be 1, 2 or 4;")
    with pytest.raises(ValueError, match=f"^{head}SparsityConfig preset='x': expected one of"):
        BackendOptions.parse({"preset": "x"})
    with pytest.raises(ValueError, match=f"^{head}SparsityConfig.chunk=0: expected an int >= 1"):
        BackendOptions.parse({"chunk": 0})
    with pytest.raises(ValueError, match=r"^sparse_compile: unknown option\(s\) \['bogus'\]"):
        BackendOptions.parse({"bogus": 1})
