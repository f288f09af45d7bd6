"""The Faust stream processors that run the invariant engine on Kafka."""
