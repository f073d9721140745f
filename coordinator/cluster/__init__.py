"""Several coordinator instances sharing one state topic (issue 10, step 2): who owns which state partition, and
where each instance can be reached. Kafka decides ownership (the instances form a consumer group of their own on
the state topic); transactional producers fence a previous owner (coordinator/storage/transactions.py)."""
