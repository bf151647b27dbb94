"""Storage profiles: every shipped figure has a source; bad names list the valid ones."""

import json
import math

import pytest

from ckptio import errors
from ckptio.cli import main
from ckptio.profiles import FIGURES, available, load_profile

REQUIRED = {"local-nvme", "abci-lustre", "cloud-s3", "fsx-lustre", "gcs"}


def test_required_profiles_ship() -> None:
    assert set(available()) >= REQUIRED


@pytest.mark.parametrize("name", available())
def test_every_figure_has_a_source(name: str) -> None:
    p = load_profile(name)
    assert set(p.figures) == set(FIGURES)
    for fig_name, fig in p.figures.items():
        assert fig.value > 0, fig_name
        assert len(fig.source) > 10, (name, fig_name)
    assert p.streams >= 1 and p.part_size > 0


def test_published_figures_are_not_marked_assumption() -> None:
    s3 = load_profile("cloud-s3")
    assert s3.write_request_rate == 3500 and not s3.figures["write_request_rate"].assumption
    assert s3.figures["metadata_latency"].assumption
    assert load_profile("abci-lustre").aggregate_bandwidth == 70e9


def test_overrides_parse_units_and_mark_the_figure() -> None:
    p = load_profile("cloud-s3", {"stream_bandwidth": "100MB/s", "request_latency": "20ms"})
    assert p.stream_bandwidth == 100e6
    assert math.isclose(p.request_latency, 0.02)
    assert "stream_bandwidth" in p.overridden


def test_unknown_profile_lists_valid_names() -> None:
    with pytest.raises(errors.InvalidArgumentError, match=r"valid: .*cloud-s3"):
        load_profile("cloud-s4")


def test_unknown_field_lists_valid_fields() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="valid: request_latency"):
        load_profile("cloud-s3", {"stream_bandwith": "1GB/s"})


def test_profiles_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {d["name"] for d in data}
    assert names >= REQUIRED
    s3 = next(d for d in data if d["name"] == "cloud-s3")
    assert s3["figures"]["aggregate_bandwidth"]["value"] is None  # unlimited
    assert s3["figures"]["stream_bandwidth"]["unit"] == "B/s"


def test_profiles_cli_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "nope"]) == 2
    assert "abci-lustre" in capsys.readouterr().err
