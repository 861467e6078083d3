"""The discrete-event simulator and the capacity planner: the seed's drills on the platform's own
policy code (:mod:`.fleet`, :mod:`.drills`, :mod:`.traces`, :mod:`.plan`).
"""
