#!/bin/bash
grep fail values.txt > output.txt
