"""Operations inside one transaction: the one writer of message state (``moves``) and what it
maintains, enqueue, lease, settle, sweep, browse, receipts, privileges, the journal and waiting."""
