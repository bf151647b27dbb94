"""Test helpers shipped with ckptio: the Store conformance suite and fixtures (a pytest plugin).

Third-party backends reuse the suite with a short subclass::

    from ckptio.testing.store_tests import StoreTests

    class TestMyStore(StoreTests):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(f"myfs://{tmp_path}")
"""
