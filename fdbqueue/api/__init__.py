"""The public operations over ``ops``: ``Queue``, the queue manager, moves and redrives between
queues, routing, schedules and bulk export."""
