#!/bin/bash
grep error values.txt > summary.txt
