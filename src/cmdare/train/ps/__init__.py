"""The parameter shards on Ray: the shard group, its channels, evacuation, placement changes, balancing, mitigation."""
