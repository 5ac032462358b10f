"""Clustering techniques: `khc` (2-norm k-hyperplane clustering to proven global optimality)."""
