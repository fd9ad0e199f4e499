"""What is stored: the keyspace, a message's record, queue settings, database time and the budgets
of one transaction. Imports the engines' contract and nothing above it."""
