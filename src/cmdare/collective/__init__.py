"""Elastic all-reduce: a group of training members that averages gradients with a collective each step and is
re-formed at a new size, with a new epoch, when a member is lost or joins.

* :mod:`~cmdare.collective.rendezvous`: the store a group's members meet through, hosted by the run's driver.
* :mod:`~cmdare.collective.elastic_group`: one member's view of the group: form it at an epoch, all-reduce and
  broadcast within a deadline, and a lost peer raised as :class:`PeerLost`, never a hang.
* :mod:`~cmdare.collective.buckets`: gradients averaged in buckets launched during backward (as DDP does).

The collectives are gloo's (``torch.distributed``), on process groups built directly (no global default group),
so a member can abandon a group whose peer died and form the next one in the same process.
"""

from cmdare.collective.buckets import GradientBuckets
from cmdare.collective.elastic_group import ElasticGroup, PeerLost
from cmdare.collective.rendezvous import Rendezvous

__all__ = ["ElasticGroup", "GradientBuckets", "PeerLost", "Rendezvous"]
