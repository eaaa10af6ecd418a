#!/bin/bash
mv data.txt total.txt
