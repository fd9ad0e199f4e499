"""What runs: workers, the dispatcher, fair service of many queues, forwarding between
databases, store-and-forward, and the metrics exporter."""
