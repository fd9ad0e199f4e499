"""Spark: the data source ``fdbqueue`` (read, stream and write queues and journals) and the
audit (the demo's Spark step is the command line's: ``cli/spark_step.py``). Imported only
when used; it needs the ``spark`` extra (pyspark, pyarrow).

    import fdbqueue.spark
    fdbqueue.spark.register(spark)   # or: spark = fdbqueue.spark.local_session()
"""

from fdbqueue.spark.source import local_session, register

__all__ = ["local_session", "register"]
