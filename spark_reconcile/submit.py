"""Entry point for ``spark-submit``: the same job as ``compensator reconcile``, on a cluster.

    spark-submit --master spark://host:7077 --jars /usr/share/java/postgresql.jar \
        --py-files reconcile.zip spark_reconcile/submit.py --date 2026-11-20 [reconcile options]

The master and resources come from spark-submit (the session builder does not override them). All
transforms are built-in Spark expressions, no Python UDFs, so executors run JVM code only and need
no Python packages; the driver needs this repository's packages (``--py-files``) and its
dependencies (asyncpg, pyarrow) for the summary, report and outbox.
"""

from __future__ import annotations

import sys

from spark_reconcile.command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
