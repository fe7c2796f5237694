"""spark_reconcile package."""
