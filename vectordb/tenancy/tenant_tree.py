"""TenantTree: the frozen hierarchy that every tenant's shortlists hang from (Curator's GCT).

Trained once, by hierarchical k-means over the first vectors the index gets (its build, or its
first insert), and never changed after (as in Curator): a new vector descends greedily to the
nearest child at every level, so its path depends only on the vector. A node splits into up to
``branching`` children while it holds more than ``leaf_size`` of the training vectors (scaled
to the whole set when training sees a sample), to at most ``MAX_DEPTH`` levels.

Nodes are numbered so that the children of a node are consecutive: node ``n``'s children are
``first_child[n] .. first_child[n] + n_children[n] - 1``; node 0 is the root. Centroids live in
the space the index compares in (metric.prepare), held as float16; distances are squared L2.

Thread-safety: immutable after training; any thread may read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["MAX_DEPTH", "TenantTree"]

MAX_DEPTH = 8
_TRAIN_SAMPLE = 100_000  # vectors the tree is trained on, at most
_KMEANS_ITER = 10


class TenantTree:
    def __init__(self, centroids: Any, parent: Any, first_child: Any, n_children: Any) -> None:
        # float16: half the bytes, and a child's rank moves only between near-equal distances
        self.centroids = np.ascontiguousarray(centroids, np.float16)
        self.parent = np.asarray(parent, np.int32)
        self.first_child = np.asarray(first_child, np.int32)
        self.n_children = np.asarray(n_children, np.int32)
        self.depth = np.zeros(len(self.parent), np.int32)
        for node in range(1, len(self.parent)):  # parents come before their children
            self.depth[node] = self.depth[self.parent[node]] + 1
        self._paths: dict[int, tuple[int, ...]] = {}
        # ancestor[n, d]: the node at depth d on the path to n (-1 below n's depth)
        self.ancestor = np.full((len(self.parent), int(self.depth.max()) + 1), -1, np.int32)
        for node in range(len(self.parent)):
            d = int(self.depth[node])
            if node:
                self.ancestor[node, :d] = self.ancestor[self.parent[node], :d]
            self.ancestor[node, d] = node

    @classmethod
    def single(cls, dim: int) -> TenantTree:
        """A root alone: every shortlist at the root (an index with no vectors yet)."""
        return cls(np.zeros((1, dim), np.float32), [-1], [0], [0])

    @classmethod
    def train(
        cls, prepared: np.ndarray, total: int, branching: int, leaf_size: int, seed: int
    ) -> TenantTree:
        """A tree over ``prepared`` vectors (float32), a sample of ``total`` vectors."""
        rng = np.random.default_rng(seed)
        if len(prepared) > _TRAIN_SAMPLE:
            prepared = prepared[np.sort(rng.choice(len(prepared), _TRAIN_SAMPLE, replace=False))]
        scale = len(prepared) / max(total, 1)  # sample vectors per real vector
        centroids = [prepared.mean(axis=0) if len(prepared) else np.zeros(prepared.shape[1])]
        parent, first_child, n_children, depth = [-1], [0], [0], [0]
        members = [np.arange(len(prepared))]
        node = 0
        while node < len(parent):
            rows = members[node]
            wanted = math.ceil(len(rows) / max(scale, 1e-12) / leaf_size)
            if wanted > 1 and depth[node] < MAX_DEPTH and len(rows) >= 2:
                k = min(branching, wanted, len(rows))
                centres, labels = _kmeans(prepared[rows], k, seed + node)
                first_child[node], n_children[node] = len(parent), k
                for c in range(k):
                    centroids.append(centres[c])
                    parent.append(node)
                    first_child.append(0)
                    n_children.append(0)
                    depth.append(depth[node] + 1)
                    members.append(rows[labels == c])
            members[node] = rows[:0]  # training rows are not needed once placed
            node += 1
        return cls(np.asarray(centroids, np.float32), parent, first_child, n_children)

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    def is_leaf(self, node: int) -> bool:
        return bool(self.n_children[node] == 0)

    def children(self, node: int) -> range:
        first = int(self.first_child[node])
        return range(first, first + int(self.n_children[node]))

    def path(self, leaf: int) -> tuple[int, ...]:
        """Nodes from the root down to ``leaf``."""
        cached = self._paths.get(leaf)
        if cached is None:
            nodes = [leaf]
            while nodes[-1] > 0:
                nodes.append(int(self.parent[nodes[-1]]))
            cached = self._paths[leaf] = tuple(reversed(nodes))
        return cached

    def descend(self, prepared: np.ndarray) -> np.ndarray:
        """The leaf each prepared vector reaches by taking the nearest child at every level."""
        node = np.zeros(len(prepared), np.int32)
        while True:
            inner = self.n_children[node] > 0
            if not inner.any():
                return node
            rows = np.flatnonzero(inner)
            for parent in np.unique(node[rows]).tolist():
                mine = rows[node[rows] == parent]
                first = int(self.first_child[parent])
                centres = self.centroids[first : first + int(self.n_children[parent])]
                centres = centres.astype(np.float32)
                node[mine] = first + _nearest(prepared[mine], centres)

    def snapshot(self) -> dict[str, np.ndarray]:
        return {
            "tenant_tree_centroids": self.centroids,
            "tenant_tree_parent": self.parent,
            "tenant_tree_first_child": self.first_child,
            "tenant_tree_n_children": self.n_children,
        }

    @classmethod
    def restore(cls, arrays: dict[str, np.ndarray]) -> TenantTree:
        return cls(
            arrays["tenant_tree_centroids"],
            arrays["tenant_tree_parent"],
            arrays["tenant_tree_first_child"],
            arrays["tenant_tree_n_children"],
        )

    def resident_bytes(self) -> int:
        return self.centroids.nbytes + 16 * self.n_nodes


def _nearest(vectors: np.ndarray, centres: np.ndarray) -> np.ndarray:
    products = vectors @ centres.T
    norms = np.einsum("ij,ij->i", centres, centres)
    return np.argmin(norms[None, :] - 2.0 * products, axis=1).astype(np.int32)


def _kmeans(vectors: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    import faiss

    vectors = np.ascontiguousarray(vectors, np.float32)
    kmeans = faiss.Kmeans(
        vectors.shape[1], k, niter=_KMEANS_ITER, seed=seed % (2**31), min_points_per_centroid=1,
        max_points_per_centroid=512, spherical=False,
    )  # fmt: skip
    kmeans.train(vectors)
    centres = np.asarray(kmeans.centroids, np.float32)
    return centres, _nearest(vectors, centres)
