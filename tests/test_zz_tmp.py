from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from tests.test_queue_model import QueueModel

def test_fresh():
    run_state_machine_as_test(QueueModel, settings=settings(QueueModel.TestCase.settings, database=None))
