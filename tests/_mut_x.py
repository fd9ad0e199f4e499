import inspect, textwrap, traceback, functools
import fdbqueue.contention as c
src = textwrap.dedent(inspect.getsource(c.fulfil)).replace("limit=2 * len(reqs)", "limit=2 * len(reqs) + 1000")
ns = dict(vars(c)); ns["__builtins__"] = __builtins__; src = "from __future__ import annotations\n" + src; exec(src, ns); c.fulfil = ns["fulfil"]
from hypothesis import settings, HealthCheck, Phase
from tests.test_delivery_model import DeliveryModel
LOG = open("/tmp/scratch/explore.log", "w")
def wrap(name, f):
    @functools.wraps(f)
    def w(self, *a, **k):
        self._steps = getattr(self, "_steps", []) + [f"{name}{a}{k}"]
        try:
            return f(self, *a, **k)
        except BaseException as e:
            LOG.write("=" * 60 + "\n" + "\n".join(self._steps) + "\n" + traceback.format_exc() + "\n"); LOG.flush()
            raise
    return w
for name in ["enqueue","enqueue_same_key_twice","enqueue_many","lease","work","dequeue","ack","nack","extend","settle_expired_lease","settle_stale_lease","advance","sweep","every_message_in_exactly_one_place"]:
    f = getattr(DeliveryModel, name)
    f.__wrapped_orig__ = True
    # hypothesis stores rule metadata on the function; copy it
    w = wrap(name, f)
    for attr in dir(f):
        if attr.startswith("hypothesis"):
            setattr(w, attr, getattr(f, attr))
    setattr(DeliveryModel, name, w)
class Explore(DeliveryModel):
    pass
Explore.TestCase.settings = settings(max_examples=3000, stateful_step_count=100, deadline=None, database=None,
    suppress_health_check=list(HealthCheck), phases=[Phase.generate])
TestMut = Explore.TestCase
