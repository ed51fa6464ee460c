"""The decision engine: between the API and the stores, it takes decisions, ingests feedback and keeps
each worker's view of its campaigns (the policies themselves stay pure, in ``latebandit.policies``)."""
