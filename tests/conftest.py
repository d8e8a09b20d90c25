import batchpart.testing

batchpart.testing.register()
