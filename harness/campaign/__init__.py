"""``kvfence campaign``: the shards of a campaign run on an engine (docs/campaigns.md).

A campaign is a list of shards (``shards.ShardSpec``: one target of contract x kernel x sizing x budget, shard
``I/N`` of it, its seed block); each shard is an ordinary ``python -m kvfence fuzz ... --shard I/N`` child under a
timeout (``task.run_shard``), so a crashed, hung or poisoned process never carries over to the next shard. The
engines only place the shards: ``local`` runs them as processes on this host (one GPU each, as ``--jobs`` places
its jobs), ``ray`` as one Ray task each (``ray_engine``: the optional extra ``kvfence[ray]``; nothing else here
imports Ray). ``outcome`` merges what the shards wrote into one run folder (``kvfence report --merge``'s merge)
with a ``shards`` table, and decides the exit code as ``fuzz`` does.
"""
