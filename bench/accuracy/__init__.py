"""Accuracy on real data (issue 38): dpcli's defaults, `auto` and careful caps against OpenDP, Tumult and PipelineDP."""
