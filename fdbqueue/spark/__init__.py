"""Spark: the data source ``fdbqueue`` (read, stream and write queues and journals), the audit and
the demo's Spark step. Imported only when used; it needs the ``spark`` extra (pyspark, pyarrow).

    import fdbqueue.spark
    fdbqueue.spark.register(spark)   # or: spark = fdbqueue.spark.local_session()
"""

from fdbqueue.spark.source import local_session, register

__all__ = ["local_session", "register"]
