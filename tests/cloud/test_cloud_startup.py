"""StartupDelay: fixed delays, and start-up phases drawn from a startup model the caller passes in."""

from __future__ import annotations

import numpy as np
import pytest

from cmdare.cloud.local import LocalProcessProvider, StartupDelay
from cmdare.cloud.servers import ServerSpec
from cmdare.errors import UserInputError

WORKER = ServerSpec(gpu_type="v100", cloud="local", region="local", transient=True, price_per_hour_usd=0.0,
                    role="worker")


class Toy:
    """A startup model knowing only K80s."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sample(self, rng: np.random.Generator, gpu: str, transient: bool, region: str | None) -> dict[str, float]:
        self.calls.append(gpu)
        if gpu != "k80":
            raise KeyError(gpu)
        return {"Provisioning": 10.0, "Staging": 20.0, "Framework": 5.0}


def test_a_fixed_delay_needs_no_model() -> None:
    delay = StartupDelay("3", speedup=2.0)
    phases = delay.sample(WORKER)
    assert phases == {"Provisioning": 3.0}
    assert delay.wall_s(phases) == 1.5


def test_model_mode_draws_from_the_given_model_falling_back_to_k80() -> None:
    toy = Toy()
    delay = StartupDelay("model", speedup=10.0, seed=1, model=toy)
    phases = delay.sample(WORKER)
    assert toy.calls == ["v100", "k80"]
    assert delay.wall_s(phases) == pytest.approx(3.0)  # Framework is not waited for


def test_a_factory_is_called_once_on_first_use() -> None:
    made: list[Toy] = []

    def factory() -> Toy:
        made.append(Toy())
        return made[-1]

    delay = StartupDelay("model", 1.0, 0, model=factory)
    assert made == []
    delay.sample(WORKER)
    delay.sample(WORKER)
    assert len(made) == 1


def test_model_mode_without_a_model_says_what_to_pass() -> None:
    delay = StartupDelay("model", 1.0, 0)  # the trainer's positional call
    with pytest.raises(UserInputError, match="startup_model"):
        delay.sample(WORKER)


def test_providers_default_to_no_delay() -> None:
    server = LocalProcessProvider().request(WORKER)
    assert server.phases_s == {"Provisioning": 0.0}
    assert server.ready_at == pytest.approx(server.requested_at)


def test_the_predict_startup_model_plugs_in() -> None:
    from cmdare.predict import startup_model

    delay = StartupDelay("model", 1000.0, 0, model=startup_model)
    phases = delay.sample(WORKER)
    assert {"Provisioning", "Staging", "Booting"} <= set(phases)
    # the model's own draw for the server's GPU and market, from the delay's seeded stream, compressed 1000x
    assert phases == startup_model().sample(np.random.default_rng(0), "v100", True, None)
    assert delay.wall_s(phases) == pytest.approx(sum(v for k, v in phases.items() if k != "Framework") / 1000.0)
