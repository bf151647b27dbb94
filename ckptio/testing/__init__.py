"""Test helpers shipped with ckptio: the Store conformance suite and fixtures (a pytest plugin).

Third-party backends reuse the suite with a short subclass that opens the store and reaches
its storage around it (:mod:`ckptio.testing.store_tests` says what to implement)::

    from ckptio.testing.store_tests import DirectoryRawAccess, StoreTests

    class TestMyStore(DirectoryRawAccess, StoreTests):
        @pytest.fixture
        def store(self, tmp_path):
            self.raw_root = str(tmp_path)
            return MyStore(f"myfs://{tmp_path}")
"""

__all__: list[str] = []
