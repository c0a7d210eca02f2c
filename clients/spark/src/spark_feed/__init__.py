"""The PySpark streaming sink into Leasecast (``spark_feed.sink``).

Importing this package imports nothing from Spark; ``spark_feed.sink`` needs
``pyspark[sql]`` (it brings pyarrow, which Python data sources need).
"""
