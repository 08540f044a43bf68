"""The speed policy: which source drafts each step and how many tokens, from measured costs and acceptance.

Nothing here can change what a reply says, only how fast it is written: the loop in
:mod:`localspec.core` verifies every draft exactly, and asks this package only through the small
protocols of :mod:`localspec.core.policy`. ``core`` never imports it; :func:`.policy.speculative_decoder`
puts the two together.
"""
