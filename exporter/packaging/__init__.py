"""`vitedge package`: app-ready bundles that check themselves: what every bundle shares (bundle), CoreML
(package) and ExecuTorch for Android (package_android).
"""
