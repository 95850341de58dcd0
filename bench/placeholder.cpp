namespace twell::bench {}
