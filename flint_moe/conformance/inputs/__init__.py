"""What a conformance case is and the data it runs on: the case matrix (``cases``), the deterministic data
profiles (``profiles``) and cases on a real checkpoint layer (``checkpoint``)."""
