from hypothesis import settings, Phase, HealthCheck
from hypothesis.stateful import run_state_machine_as_test
from tests.test_queue_model import QueueModel

def test_dbg():
    run_state_machine_as_test(QueueModel, settings=settings(max_examples=3000, stateful_step_count=80, deadline=None, phases=[Phase.reuse, Phase.generate], suppress_health_check=[HealthCheck.too_slow]))
