"""A virtual multi-node cluster on one machine: network namespaces, veth links, tc shaping."""

from __future__ import annotations

from .netns import ClusterSpec, VClusterError, cluster_down, cluster_status, cluster_up, plan_run

__all__ = [
    "ClusterSpec",
    "VClusterError",
    "cluster_up",
    "cluster_down",
    "cluster_status",
    "plan_run",
]
