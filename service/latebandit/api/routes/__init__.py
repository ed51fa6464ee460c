"""The API's routes, one router per resource; create_app includes them."""
