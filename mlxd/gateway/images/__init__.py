"""Images a request carries, on the gateway's side: what the bytes are (``formats``), the
limits a request's images are held to (``limits``), and image URLs fetched with caps
(``fetch``). Surfaces parse image parts (surfaces/images.py) and remote backends rebuild them
(backends/remote/bodies.py) through these; the gateway never decodes pixels."""
