namespace twell::test {}
